// The Node producer against a real broker and real gymbus workers (started by tests/test_node_producer.py,
// which sets NATS_URL, GYMBUS_SCHEMAS and GYMBUS_TASKS). Run alone: `npm test` with those set.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import { connect, headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  InvalidStart,
  loadSchemas,
  msgIdOf,
  newTraceparent,
  publishStart,
  readRejections,
  readResults,
  startOf,
  validateStart,
  writeManifest,
} from "../gymbus.mjs";

const N = Number(process.env.GYMBUS_N ?? 8);
const rows = fs.readFileSync(process.env.GYMBUS_TASKS, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
const schemas = loadSchemas(process.env.GYMBUS_SCHEMAS);
let nc, js, jsm;

before(async () => {
  nc = await connect({ servers: process.env.NATS_URL });
  js = jetstream(nc);
  jsm = await jetstreamManager(nc);
});
after(async () => nc?.close());

const start = (row, runId, taskIndex, extra = {}) =>
  ({ ...startOf(row, { runId, taskIndex, agent: "simple_agent", env: "math" }), ...extra });

test(`${N} tasks published, ${N} Results read; a duplicate is deduplicated; trace context propagated`, async () => {
  const run = "node-run";
  await writeManifest(nc, schemas, { run_id: run, expected: N, defaults: { sampling: { temperature: 0.7 } } });
  const traces = new Map();
  for (let i = 0; i < N; i++) {
    const s = start(rows[i % rows.length], run, i);
    const traceparent = newTraceparent();
    traces.set(`${run}.${i}.0`, traceparent);
    const ack = await publishStart(js, schemas, s, { traceparent });
    assert.equal(ack.duplicate, false);
  }
  const again = await publishStart(js, schemas, start(rows[0], run, 0));
  assert.equal(again.duplicate, true, "the same message id inside the duplicate window is stored once");

  const results = await readResults(js, run, N, { timeoutMs: 60_000 });
  assert.equal(results.size, N);
  const validateResult = schemas.def("Result");
  for (const [sid, { result, headers: h }] of results) {
    assert.ok(validateResult(result), JSON.stringify(validateResult.errors));
    assert.equal(result.failure_kind, null, result.failure_reason);
    assert.ok(result.reward === 0 || result.reward === 1);
    assert.equal(result.sampling.temperature, 0.7, "the manifest's defaults are applied by the workers");
    assert.equal(result.output[0].type, "function_call", "the environment's tools are offered by the workers");
    assert.match(h["Nats-Msg-Id"], new RegExp(`^${sid.replaceAll(".", "\\.")}:\\d+$`));
    const [, sentTrace] = traces.get(sid).split("-");
    assert.equal(h.traceparent.split("-")[1], sentTrace, "the Result carries the producer's trace");
  }
  const stored = await jsm.streams.info("GYM_RESULTS", { subjects_filter: `gym.result.${run}` });
  assert.equal(stored.state.subjects[`gym.result.${run}`], N, "one Result per rollout, the duplicate ran once");
  console.log(`published ${N}, read ${results.size} Results, duplicate stored once, traces propagated`);
});

test("a schema-invalid Start is rejected before publishing, with its path", async () => {
  const before = (await jsm.streams.info("GYM_WORK")).state.last_seq;
  const typo = start(rows[0], "node-bad", 0, { options: { max_step: 3 } });
  assert.throws(() => validateStart(schemas, typo), (e) => e instanceof InvalidStart && /\/options.*max_step/.test(e.message));
  await assert.rejects(publishStart(js, schemas, typo), InvalidStart);
  const noAnswer = start({ responses_create_params: rows[0].responses_create_params }, "node-bad", 1);
  assert.throws(() => validateStart(schemas, noAnswer), /\/meta must have required property 'expected_answer'/);
  const pasted = rows[0];
  assert.throws(() => validateStart(schemas, pasted), /must have required property 'kind'/);
  assert.equal((await jsm.streams.info("GYM_WORK")).state.last_seq, before, "nothing was published");
  console.log("schema-invalid Starts rejected before publishing");
});

test("an unknown environment is rejected by the workers within seconds, naming it", async () => {
  const t0 = Date.now();
  const s = start(rows[0], "node-unknown", 0, { env: "mathh" });
  schemas.def("Start")(s) || assert.fail("the generic Start schema accepts any environment name");
  await js.publish("gym.agent.simple_agent", JSON.stringify(s), { msgID: msgIdOf(s) });
  const [{ result }] = (await readResults(js, "node-unknown", 1, { timeoutMs: 30_000 })).values();
  const seconds = (Date.now() - t0) / 1000;
  assert.equal(result.failure_kind, "invalid_input");
  assert.equal(result.reward, null);
  assert.match(result.failure_reason, /unknown environment 'mathh'.*registered environments: math.*\$\.env/);
  assert.ok(seconds < 15, `took ${seconds}s`);
  console.log(`unknown environment rejected in ${seconds.toFixed(1)} s: ${result.failure_reason}`);
});

test("a message naming no run is dead-lettered where its producer reads it", async () => {
  const h = headers();
  await js.publish("gym.agent.simple_agent", "What is 6*7?", { msgID: "node-garbage-1", headers: h });
  const letters = await readRejections(js, "simple_agent", ["node-garbage-1"]);
  const letter = letters.get("node-garbage-1");
  assert.ok(schemas.def("DeadLetter")(letter));
  assert.equal(letter.failure_kind, "invalid_input");
  assert.equal(letter.payload, "What is 6*7?");
  console.log(`not-JSON message rejected: ${letter.error}`);
});
