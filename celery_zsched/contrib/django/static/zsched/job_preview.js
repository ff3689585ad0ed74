/* Live next fire times on the job add/change form of the celery-zsched admin.
 * As the timing fields change, ask the admin's preview endpoint (same origin,
 * no third-party code) and redraw the table in #zsched-next-fires. */
(function () {
  "use strict";
  var FIELDS = ["cron", "timezone", "interval_s", "day_rule", "jitter_s", "max_runs"];
  var box, timer, asked = 0;

  function value(name) {
    var checked = document.querySelector('input[name="' + name + '"]:checked');
    if (checked) { return checked.value; }
    var el = document.getElementById("id_" + name);
    return el && el.type !== "radio" ? el.value : "";
  }

  function cell(row, text, tag) {
    var td = document.createElement(tag || "td");
    td.textContent = text;
    row.appendChild(td);
  }

  function note(fire) {
    var marks = [];
    if (fire.shifted) { marks.push("shifted: a DST gap skipped its wall time"); }
    if (fire.repeated) { marks.push("repeated: DST fold"); }
    return marks.join("; ");
  }

  function draw(data) {
    box.textContent = "";
    if (data.errors) {
      Object.keys(data.errors).forEach(function (field) {
        var p = document.createElement("p");
        p.className = "errornote";
        p.textContent = field + ": " + data.errors[field].join(" ");
        box.appendChild(p);
      });
      return;
    }
    if (data.fires.length) {
      var table = document.createElement("table");
      var head = table.createTHead().insertRow();
      ["Local (" + data.timezone + ")", "UTC", "Jitter", ""].forEach(function (t) {
        cell(head, t, "th");
      });
      var body = table.createTBody();
      data.fires.forEach(function (f) {
        var row = body.insertRow();
        cell(row, f.local.replace("T", " "));
        cell(row, f.utc.replace("T", " "));
        cell(row, f.jitter_s ? "+0.." + f.jitter_s + " s" : "-");
        cell(row, note(f));
      });
      box.appendChild(table);
    }
    if (data.note) {
      var p = document.createElement("p");
      p.textContent = data.note;
      box.appendChild(p);
    }
  }

  function refresh() {
    var query = new URLSearchParams();
    FIELDS.forEach(function (name) { query.set(name, value(name)); });
    var mine = ++asked;  // only the answer to the latest edit is drawn
    fetch(box.dataset.url + "?" + query.toString(), {credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (data) { if (mine === asked) { draw(data); } })
      .catch(function () {});
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }

  document.addEventListener("DOMContentLoaded", function () {
    box = document.getElementById("zsched-next-fires");
    if (!box) { return; }
    FIELDS.forEach(function (name) {
      document.querySelectorAll('[name="' + name + '"]').forEach(function (el) {
        el.addEventListener("input", later);
        el.addEventListener("change", later);
      });
    });
    if (box.dataset.live === "1") { refresh(); }  // the add form starts empty
  });
})();
