// A job gateway worker in Node.js (no dependencies: Node's built-in fetch).
//
// It long-polls GET /jobs/next, fetches the job's URL, and reports the outcome:
// POST /jobs/{id}/complete on a 2xx, POST /jobs/{id}/error otherwise, with the
// target's status and Retry-After (which feed pacing and the retry delay).
// It echoes the lease token and the telemetry it was handed. Each step is
// logged as one JSON line on stdout, for the tests to read.
//
// With BATCH > 1 it polls GET /jobs/next?max=BATCH, runs the jobs it got at
// once, and reports them all in one POST /jobs/report; each report gets its own
// answer, with the status the single route would have given as `code`.
//
// Usage: node worker.mjs GATEWAY_URL TOKEN [QUEUE] [BATCH]
const [gateway, token, queue = "", batchArg = "1"] = process.argv.slice(2);
const batch = Number.parseInt(batchArg, 10) || 1;
const headers = { Authorization: `Bearer ${token}`, "Content-Type": "application/json" };
const log = (event, fields) => console.log(JSON.stringify({ event, at: Date.now(), ...fields }));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What to report for one job: its outcome, and the fields of that outcome's report.
async function run(job) {
  log("job", { id: job.id, url: job.url, occurrence: job.occurrence, attempt: job.attempt });
  let res;
  try {
    res = await fetch(job.url);
    await res.arrayBuffer();
  } catch (err) {
    return ["error", { error: `fetch failed: ${err.message}` }];
  }
  if (res.ok) return ["complete", {}];
  const body = { error: `HTTP ${res.status}`, status: res.status };
  const retryAfter = Number.parseFloat(res.headers.get("retry-after") ?? "");
  if (Number.isFinite(retryAfter)) body.retry_after = retryAfter;
  return ["error", body];
}

const echo = (job) => ({
  lease: job.lease, scheduled_at: job.scheduled_at, picked_up_at: job.picked_up_at,
});

async function report(job, outcome, body) {
  const res = await fetch(`${gateway}/jobs/${encodeURIComponent(job.id)}/${outcome}`, {
    method: "POST", headers, body: JSON.stringify({ ...echo(job), ...body }),
  });
  log("reported", { id: job.id, outcome, status: res.status, answer: await res.json() });
}

async function reportAll(jobs, outcomes) {
  const reports = jobs.map((job, i) => ({
    id: job.id, outcome: outcomes[i][0], ...echo(job), ...outcomes[i][1],
  }));
  const res = await fetch(`${gateway}/jobs/report`, {
    method: "POST", headers, body: JSON.stringify({ reports }),
  });
  const answer = await res.json();
  if (res.status !== 200) {
    log("batch_refused", { status: res.status, answer });
    return;
  }
  answer.results.forEach(({ code, ...rest }, i) => {
    log("reported", { id: jobs[i].id, outcome: outcomes[i][0], status: code, answer: rest,
                      batch: jobs.length });
  });
}

const params = new URLSearchParams();
if (queue) params.set("queue", queue);
if (batch > 1) params.set("max", String(batch));
const query = params.size ? `?${params}` : "";
for (;;) {
  let res;
  try {
    res = await fetch(`${gateway}/jobs/next${query}`, { headers });
  } catch (err) {
    log("poll_failed", { error: err.message });
    await sleep(500);
    continue;
  }
  if (res.status === 200) {
    if (batch > 1) {
      const { jobs } = await res.json();
      await reportAll(jobs, await Promise.all(jobs.map(run)));
    } else {
      const job = await res.json();
      const [outcome, body] = await run(job);
      await report(job, outcome, body);
    }
  } else if (res.status === 204) {
    await res.arrayBuffer();
  } else {
    // 503 (shutting down, Redis down): wait as the server asks.
    const wait = Number.parseFloat(res.headers.get("retry-after") ?? "1");
    log("unavailable", { status: res.status, retry_after: wait });
    await res.arrayBuffer();
    await sleep(wait * 1000);
  }
}
