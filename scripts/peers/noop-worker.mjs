// A persistent handler (protocol 1, docs/src/protocol.md) that answers
// every job `done` at once: what scripts/bench-peers.py runs pgwake's
// lease mode with, so that it does what the peers' no-op handlers do.
import fs from "node:fs";
import net from "node:net";
import readline from "node:readline";

const inflight = Number(process.argv[2] ?? "8");
const out = fs.createWriteStream(null, { fd: Number(process.env.PGWAKE_PROTOCOL_OUT) });
const send = (msg) => out.write(JSON.stringify(msg) + "\n");
send({ type: "hello", version: 1, tasks: ["noop"], inflight });
const input = new net.Socket({ fd: Number(process.env.PGWAKE_PROTOCOL_IN), readable: true, writable: false });
let welcomed = false;
const lines = readline.createInterface({ input });
lines.on("close", () => process.exit(0));
lines.on("line", (line) => {
  const msg = JSON.parse(line);
  if (!welcomed) { welcomed = true; return; }
  switch (msg.type) {
    case "ping": send({ type: "pong", seq: msg.seq }); break;
    case "job": send({ type: "done", id: msg.id, token: msg.token }); break;
    case "drain": out.end(() => process.exit(0)); break;
    default: break;
  }
});
