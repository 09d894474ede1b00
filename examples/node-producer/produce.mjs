#!/usr/bin/env node
// Publish a task file's rollouts to gymbus and print their Results, one JSON line each.
//
//   gymbus schema all > schemas/all.json && gymbus schema start --env math > schemas/start-math.json
//   node produce.mjs --nats nats://127.0.0.1:4222 --tasks ../../functions/math/data/example.jsonl \
//       --run demo --agent simple_agent --env math --repeats 2 --schemas schemas
import fs from "node:fs";
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { loadSchemas, newTraceparent, publishStart, readResults, startOf, writeManifest } from "./gymbus.mjs";

const { values: o } = parseArgs({
  options: {
    nats: { type: "string", default: process.env.GYMBUS_NATS_URL ?? "nats://127.0.0.1:4222" },
    tasks: { type: "string" },
    run: { type: "string" },
    agent: { type: "string", default: "simple_agent" },
    env: { type: "string", default: "math" },
    repeats: { type: "string", default: "1" },
    limit: { type: "string" },
    schemas: { type: "string", default: "schemas" },
    temperature: { type: "string" },
  },
});
if (!o.tasks || !o.run) {
  console.error("usage: node produce.mjs --tasks FILE --run RUN_ID [--nats URL] [--agent A] [--env E] [--repeats N]");
  process.exit(2);
}

const schemas = loadSchemas(o.schemas);
const lines = fs.readFileSync(o.tasks, "utf8").split("\n").filter((l) => l.trim());
const rows = lines.slice(0, o.limit ? Number(o.limit) : undefined).map((l) => JSON.parse(l));
const repeats = Number(o.repeats);
const nc = await connect({ servers: o.nats });
const js = jetstream(nc);
try {
  const defaults = o.temperature ? { sampling: { temperature: Number(o.temperature) } } : {};
  await writeManifest(nc, schemas, { run_id: o.run, expected: rows.length * repeats, tasks: rows.length, repeats, defaults });
  for (const [taskIndex, row] of rows.entries()) {
    for (let rolloutIndex = 0; rolloutIndex < repeats; rolloutIndex++) {
      const start = startOf(row, { runId: o.run, taskIndex, rolloutIndex, agent: o.agent, env: o.env });
      await publishStart(js, schemas, start, { traceparent: newTraceparent() });
    }
  }
  for (const { result } of (await readResults(js, o.run, rows.length * repeats)).values()) {
    const { session_id, reward, failure_kind, failure_reason } = result;
    console.log(JSON.stringify({ session_id, reward, failure_kind, failure_reason }));
  }
} finally {
  await nc.close();
}
