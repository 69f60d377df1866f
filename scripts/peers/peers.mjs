// The peers' side of scripts/bench-peers.py: graphile-worker and pg-boss,
// each with its own API and a no-op handler. Run with the Node the script
// installed beside the packages (they need Node 22).
//
//   node peers.mjs graphile|pgboss enqueue URL N
//   node peers.mjs graphile|pgboss work URL CONCURRENCY
//
// `work` runs until SIGTERM; the driver measures from the outside, by the
// rows each system leaves, as it does for pgwake.
import { run, makeWorkerUtils } from "graphile-worker";
import { PgBoss } from "pg-boss";

const [system, command, url, arg] = process.argv.slice(2);
const n = Number(arg);
const CHUNK = 5000;

async function graphile() {
  if (command === "enqueue") {
    const utils = await makeWorkerUtils({ connectionString: url });
    await utils.migrate();
    for (let i = 0; i < n; i += CHUNK) {
      const specs = Array.from({ length: Math.min(CHUNK, n - i) }, () => ({ identifier: "noop", payload: {} }));
      await utils.addJobs(specs);
    }
    await utils.release();
    return;
  }
  // Its defaults, with the concurrency pgwake's --concurrency has.
  const runner = await run({
    connectionString: url,
    concurrency: n,
    noHandleSignals: true,
    taskList: { noop: async () => {} },
  });
  process.on("SIGTERM", () => runner.stop().then(() => process.exit(0)));
  await runner.promise;
}

async function pgboss() {
  const boss = new PgBoss({ connectionString: url });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  if (command === "enqueue") {
    await boss.createQueue("noop");
    for (let i = 0; i < n; i += CHUNK) {
      await boss.insert("noop", Array.from({ length: Math.min(CHUNK, n - i) }, () => ({ data: {} })));
    }
    await boss.stop({ graceful: false });
    return;
  }
  // Its defaults poll every 2 s for one job per worker; these are the
  // settings its docs give for throughput: batches of 100 fetched back to
  // back while they come back full.
  await boss.work("noop", { localConcurrency: n, batchSize: 100, burstWhenBatchFull: true,
                            pollingIntervalSeconds: 0.5 }, async () => {});
  process.on("SIGTERM", () => boss.stop({ graceful: true }).then(() => process.exit(0)));
}

await (system === "graphile" ? graphile() : pgboss());
