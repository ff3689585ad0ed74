/* Live next fire times and plain words on the job add/change form of the
 * celery-zsched admin. As the timing fields change, ask the admin's preview
 * endpoint (same origin, no third-party code), redraw the table in
 * #zsched-next-fires and rewrite the sentence in #zsched-words. */
(function () {
  "use strict";
  var FIELDS = ["cron", "timezone", "interval_s", "day_rule", "jitter_s", "max_runs"];
  // Split date/time widgets: sent only when the date is ISO (YYYY-MM-DD), which
  // the endpoint reads like an import row; other locales' dates are left out.
  var TIMES = ["run_at", "start_at", "end_at"];
  var ISO_DATE = /^\d{4}-\d{2}-\d{2}$/;
  var box, words, timer, asked = 0;

  function when(name) {
    var date = value(name + "_0").trim(), clock = value(name + "_1").trim();
    if (!ISO_DATE.test(date)) { return ""; }
    return date + "T" + (clock || "00:00:00");
  }

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

  function say(data) {
    if (!words) { return; }
    if (data.errors) {
      words.textContent = Object.keys(data.errors).map(function (field) {
        return field + ": " + data.errors[field].join(" ");
      }).join("; ");
      words.className = "errornote";
    } else {
      words.textContent = data.words;
      words.className = "";
    }
  }

  function draw(data) {
    say(data);
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
        cell(row, f.dst_note);
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
    TIMES.forEach(function (name) {
      var text = when(name);
      if (text) { query.set(name, text); }
    });
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
    words = document.getElementById("zsched-words");
    if (!box) { return; }
    var names = FIELDS.slice();
    TIMES.forEach(function (name) { names.push(name + "_0", name + "_1"); });
    names.forEach(function (name) {
      document.querySelectorAll('[name="' + name + '"]').forEach(function (el) {
        el.addEventListener("input", later);
        el.addEventListener("change", later);
      });
    });
    if (box.dataset.live === "1") { refresh(); }  // the add form starts empty
  });
})();
