// A job gateway worker in Node.js (no dependencies: Node's built-in fetch).
//
// It long-polls GET /jobs/next, fetches the job's URL, and reports the outcome:
// POST /jobs/{id}/complete on a 2xx, POST /jobs/{id}/error otherwise, with the
// target's status and Retry-After (which feed pacing and the retry delay).
// It echoes the lease token and the telemetry it was handed. Each step is
// logged as one JSON line on stdout, for the tests to read.
//
// Usage: node worker.mjs GATEWAY_URL TOKEN [QUEUE]
const [gateway, token, queue = ""] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${token}`, "Content-Type": "application/json" };
const log = (event, fields) => console.log(JSON.stringify({ event, at: Date.now(), ...fields }));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function report(job, outcome, body) {
  const res = await fetch(`${gateway}/jobs/${encodeURIComponent(job.id)}/${outcome}`, {
    method: "POST",
    headers,
    body: JSON.stringify({
      lease: job.lease, scheduled_at: job.scheduled_at, picked_up_at: job.picked_up_at, ...body,
    }),
  });
  log("reported", { id: job.id, outcome, status: res.status, answer: await res.json() });
}

async function run(job) {
  log("job", { id: job.id, url: job.url, occurrence: job.occurrence, attempt: job.attempt });
  let res;
  try {
    res = await fetch(job.url);
    await res.arrayBuffer();
  } catch (err) {
    return report(job, "error", { error: `fetch failed: ${err.message}` });
  }
  if (res.ok) return report(job, "complete", {});
  const body = { error: `HTTP ${res.status}`, status: res.status };
  const retryAfter = Number.parseFloat(res.headers.get("retry-after") ?? "");
  if (Number.isFinite(retryAfter)) body.retry_after = retryAfter;
  return report(job, "error", body);
}

const query = queue ? `?queue=${encodeURIComponent(queue)}` : "";
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
    await run(await res.json());
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
