#!/usr/bin/env node
// A reference persistent handler for pgwake (protocol version 1), Node 20, no npm packages.
//
//     pgwake run --handler 'echo=persistent:node examples/persistent/worker.mjs --inflight 8'
//
// pgwake writes one JSON object a line to the fd named by PGWAKE_PROTOCOL_IN; we answer on
// PGWAKE_PROTOCOL_OUT. Jobs are promises, so the event loop keeps reading (and answering
// pings) while they run, as long as no handler blocks it. See docs/src/protocol.md.
import fs from "node:fs";
import net from "node:net";
import readline from "node:readline";
import { parseArgs } from "node:util";
import { setTimeout as sleepFor } from "node:timers/promises";

if (process.env.PGWAKE_PROTOCOL !== "1") {
  // Exit 2 before the hello is how a process says "configuration error" to pgwake.
  console.error(`worker.mjs speaks protocol 1, PGWAKE_PROTOCOL is ${JSON.stringify(process.env.PGWAKE_PROTOCOL)}: ` +
    "run it with pgwake run --handler 'TASK=persistent:node worker.mjs'");
  process.exit(2);
}
const args = parseArgs({ options: { inflight: { type: "string", default: "8" }, steps: { type: "boolean", default: false } } }).values;
const inflight = Number(args.inflight);
if (!Number.isInteger(inflight) || inflight < 1 || inflight > 1024) {
  console.error("worker.mjs: --inflight must be 1-1024");
  process.exit(2);
}

// One write() per line: the stream keeps them whole and in order.
const out = fs.createWriteStream(null, { fd: Number(process.env.PGWAKE_PROTOCOL_OUT) });
let quitting = false;
const send = (msg) => quitting || out.write(JSON.stringify(msg) + "\n");
const quit = (status) => { // once every line is written
  if (!quitting) out.end(() => process.exit(status));
  quitting = true;
};

const done = (result) => (result === undefined ? { type: "done" } : { type: "done", result });
const fail = (error, forGood = false, retryAfter) =>
  ({ type: "fail", error, for_good: forGood, ...(retryAfter == null ? {} : { retry_after: retryAfter }) });
// Not yet: run the job again in `after` seconds, no attempt used (at most 30 days).
const snooze = (after) => ({ type: "snooze", after });

const tasks = {
  async noop() {
    return done();
  },
  async echo(job, payload) {
    console.log(`echo ${job.msg.id}`); // pgwake logs stdout and stderr, tagged with the job
    console.error(`echo ${job.msg.id} on stderr`);
    return done(payload);
  },
  async sleep(job, payload) {
    try {
      await sleepFor(payload.secs * 1000, undefined, { signal: job.abort.signal });
      return done();
    } catch (e) {
      if (e.name === "AbortError") return fail("cancelled");
      throw e;
    }
  },
  async crash() {
    process.exit(1); // a poison job: pgwake charges it to this job only if it was alone in flight
  },
  async fail(job, payload) {
    return fail(payload.error ?? "failed", payload.for_good ?? false, payload.retry_after);
  },
  async snooze(job, payload) {
    return snooze(payload.secs ?? 60);
  },
  // Reports its payload's value and message, then sleeps like `sleep`.
  async progress(job, payload) {
    job.progress(payload.value ?? null, payload.message);
    return tasks.sleep(job, { secs: payload.secs ?? 0 });
  },
  // Step "a" (a line in the ledger each time its body runs), then, on attempt 1, a crash (SIGKILL)
  // before step "b", which writes what the run saw to payload.seen.
  async steps(job, payload) {
    const a = await job.step("a", async () => {
      fs.appendFileSync(payload.ledger, "a\n");
      return { charge: `ch_${job.msg.id}`, text: "tab\t<b> \u00e9" };
    });
    if (job.msg.attempt === 1) process.kill(process.pid, "SIGKILL");
    await job.step("b", async () => {
      writeSeen(payload.seen, { a, recorded: Object.keys(job.msg.steps ?? {}).sort() });
      return 2;
    });
    return done();
  },
  // Writes the job message's steps and parent_results (absent: null) to payload.seen.
  async inputs(job, payload) {
    writeSeen(payload.seen, { steps: job.msg.steps ?? null, parent_results: job.msg.parent_results ?? null });
    return done();
  },
  async sql(job, payload) {
    if (!job.msg.tx) return fail("task sql needs tx mode (--tx-tasks sql)", true);
    const results = [];
    for (const { sql, params = [] } of payload.statements) {
      const r = await job.sql(sql, params);
      // The transaction is aborted for this job: stop and fail (it rolls back).
      if (r.error) return fail(r.error.message);
      results.push({ rows: r.rows ?? [], rows_affected: r.rows_affected ?? null });
    }
    return payload.fail ? fail("failed on purpose after its statements") : done(results);
  },
};

// Whole or not at all: the test waits for the file.
const writeSeen = (path, seen) => {
  fs.writeFileSync(path + ".tmp", JSON.stringify(seen) + "\n");
  fs.renameSync(path + ".tmp", path);
};

const jobs = new Map(); // id -> job in flight
let draining = false;

class Job {
  constructor(msg) {
    Object.assign(this, { msg, abort: new AbortController(), seq: 0, waiting: null, stepWaiting: null });
  }
  // A durable step: the output an earlier run recorded (the job message's "steps", sent to a
  // process whose hello asked with steps: true), else body()'s output, recorded by pgwake before
  // this resolves. Throws when pgwake refuses it (a bad name, over 64 KiB of JSON...).
  async step(name, body) {
    const recorded = this.msg.steps ?? {};
    if (Object.hasOwn(recorded, name)) return recorded[name];
    const output = await body();
    const { id, token } = this.msg;
    const r = await new Promise((resolve) => {
      this.stepWaiting = resolve; // called by the reader with the step_recorded, or on cancel
      send({ type: "step", id, token, name, output: output ?? null });
    });
    if (r.error) throw new Error(`step ${name} refused: ${r.error}`);
    return output;
  }
  // Reports how far the job has got (shown by pgwake job show while it runs); not an answer.
  // At most 4 KiB of JSON and a 200-character message, else pgwake warns and ignores it.
  progress(value, message) {
    const { id, token } = this.msg;
    send({ type: "progress", id, token, value, ...(message == null ? {} : { message }) });
  }
  // Runs one statement in the job's claim transaction; resolves to its sql_result.
  sql(sql, params) {
    const { id, token } = this.msg;
    send({ type: "sql", id, token, seq: ++this.seq, sql, params });
    return new Promise((resolve) => {
      this.waiting = resolve; // called by the reader with the sql_result, or on cancel
    });
  }
}

async function run(job) {
  const { id, token, task, payload } = job.msg;
  let reply;
  try {
    reply = tasks[task] ? await tasks[task](job, payload) : fail(`unknown task ${JSON.stringify(task)}`, true);
  } catch (e) {
    reply = fail(String(e)); // "TypeError: …"
  }
  send({ ...reply, id, token });
  jobs.delete(id);
  if (draining && jobs.size === 0) quit(0);
}

// steps and parent_results are optional: without them, job messages carry neither (and cost nothing).
send({ type: "hello", version: 1, tasks: Object.keys(tasks), inflight, ...(args.steps ? { steps: true, parent_results: true } : {}) });
let welcomed = false;
// A net.Socket, not fs.createReadStream: a pending fs read of a pipe keeps a libuv thread,
// and process.exit waits for it forever.
const input = new net.Socket({ fd: Number(process.env.PGWAKE_PROTOCOL_IN), readable: true, writable: false });
const lines = readline.createInterface({ input });
lines.on("close", () => quit(0)); // pgwake closed fd 3: it is gone, stop at once
lines.on("line", (line) => {
  const msg = JSON.parse(line);
  if (!welcomed) { // no job comes before the welcome
    if (msg.type !== "welcome") { console.error(`worker.mjs: expected a welcome, got ${line}`); process.exit(1); }
    welcomed = true;
    return;
  }
  const job = jobs.get(msg.id);
  const ours = job && job.msg.token === msg.token; // else its answer crossed the message
  switch (msg.type) {
    case "ping": send({ type: "pong", seq: msg.seq }); break;
    case "job":
      if (draining) { send({ ...fail("draining"), id: msg.id, token: msg.token }); break; } // never sent after a drain
      jobs.set(msg.id, new Job(msg));
      run(jobs.get(msg.id)); // not awaited: jobs run side by side, the reader goes on
      break;
    case "cancel": // wakes the job: a sleep, or a wait for its statement's result
      if (ours) {
        job.abort.abort();
        job.waiting?.({ error: { message: "cancelled" } });
        job.stepWaiting?.({ error: "cancelled" });
      }
      break;
    case "sql_result": if (ours) job.waiting?.(msg); break;
    case "step_recorded": if (ours) job.stepWaiting?.(msg); break;
    case "drain": draining = true; if (jobs.size === 0) quit(0); break;
    default: console.error(`worker.mjs: ignoring a message of unknown type ${JSON.stringify(msg.type)}`);
  }
});
