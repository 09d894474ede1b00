// A gymbus producer and consumer in Node.js, written from the README ("Publishing from any language")
// and the JSON Schemas `gymbus schema` prints: the official NATS client and Ajv, nothing of gymbus.
//
//   const schemas = loadSchemas("schemas/");           // gymbus schema all / schema start --env math
//   await writeManifest(nc, { run_id, expected, defaults });
//   await publishStart(js, schemas, start);            // validated first; Nats-Msg-Id makes a repeat harmless
//   const results = await readResults(js, run_id, expected);   // one Result per rollout, latest attempt
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { headers } from "@nats-io/transport-node";
import { DeliverPolicy } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import Ajv2020 from "ajv/dist/2020.js";

/** Compile the schemas `gymbus schema all` (all.json) and `gymbus schema start --env ENV` (start-ENV.json)
 * print, in Ajv's strict mode. */
export function loadSchemas(dir) {
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  const all = JSON.parse(fs.readFileSync(path.join(dir, "all.json"), "utf8"));
  ajv.addSchema(all, "gymbus");
  const out = { ajv, def: (name) => ajv.getSchema(`gymbus#/$defs/${name}`), start: {} };
  for (const file of fs.readdirSync(dir)) {
    const env = /^start-(.+)\.json$/.exec(file)?.[1];
    if (env) out.start[env] = ajv.compile(JSON.parse(fs.readFileSync(path.join(dir, file), "utf8")));
  }
  return out;
}

/** A task row (NeMo Gym-shaped) as the Start of one of its rollouts: the row as it is. */
export function startOf(row, { runId, taskIndex, rolloutIndex = 0, agent, env, attempt = 0 }) {
  const { responses_create_params, ...meta } = row;
  return {
    kind: "start",
    run_id: runId,
    task_index: taskIndex,
    rollout_index: rolloutIndex,
    attempt,
    agent,
    env,
    responses_create_params,
    meta,
  };
}

/** The Start's message id: the same rollout published twice is stored once. */
export const msgIdOf = (s) => `${s.run_id}.${s.task_index}.${s.rollout_index ?? 0}:start:${s.attempt ?? 0}`;

export class InvalidStart extends Error {
  constructor(errors) {
    super(errors.map((e) => `${e.instancePath || "/"} ${e.message}${e.params?.additionalProperty ? `: ${e.params.additionalProperty}` : ""}`).join("; "));
    this.errors = errors;
  }
}

/** Check a Start against the schema of its environment (if given) or the generic Start schema. */
export function validateStart(schemas, start) {
  const validate = schemas.start[start.env] ?? schemas.def("Start");
  if (!validate(start)) throw new InvalidStart(validate.errors);
}

/** A new W3C trace context (the producer's span), as the `traceparent` header value. */
export function newTraceparent() {
  return `00-${crypto.randomBytes(16).toString("hex")}-${crypto.randomBytes(8).toString("hex")}-01`;
}

/** Write the run's manifest (KV `runs`, key `<run_id>.manifest`) before its Starts: its totals, and the
 * defaults the agent workers apply to every Start that leaves them out. */
export async function writeManifest(nc, schemas, manifest) {
  const validate = schemas.def("Manifest");
  if (!validate(manifest)) throw new InvalidStart(validate.errors);
  const kv = await new Kvm(nc).open("runs");
  await kv.put(`${manifest.run_id}.manifest`, JSON.stringify(manifest));
}

/** Validate, then publish a Start to gym.agent.<agent> with its message id (and trace context). */
export async function publishStart(js, schemas, start, { traceparent } = {}) {
  validateStart(schemas, start);
  const h = headers();
  if (traceparent) h.set("traceparent", traceparent);
  return js.publish(`gym.agent.${start.agent}`, JSON.stringify(start), { msgID: msgIdOf(start), headers: h });
}

/** Read a run's Results from the start of GYM_RESULTS (an ordered consumer filtered to
 * gym.result.<run>) until `expected` rollouts have one: one Result per session_id, the highest
 * attempt wins. Returns Map(session_id -> { result, headers }). */
export async function readResults(js, runId, expected, { timeoutMs = 60_000 } = {}) {
  const consumer = await js.consumers.get("GYM_RESULTS", {
    filter_subjects: [`gym.result.${runId}`],
    deliver_policy: DeliverPolicy.All,
  });
  const out = new Map();
  const messages = await consumer.consume();
  const timer = setTimeout(() => messages.stop(), timeoutMs);
  for await (const m of messages) {
    const result = m.json();
    const kept = out.get(result.session_id);
    if (!kept || result.attempt >= kept.result.attempt) {
      out.set(result.session_id, { result, headers: Object.fromEntries([...(m.headers?.keys() ?? [])].map((k) => [k, m.headers.get(k)])) });
    }
    if (out.size >= expected) break;
  }
  clearTimeout(timer);
  await messages.close();
  return out;
}

/** Dead letters of the agent's subject carrying one of `msgIds` (messages rejected before they
 * named a run: not JSON, not a Start), as they arrive on gym.dead.<agent>. */
export async function readRejections(js, agent, msgIds, { timeoutMs = 30_000 } = {}) {
  const consumer = await js.consumers.get("GYM_DEAD", {
    filter_subjects: [`gym.dead.${agent}`],
    deliver_policy: DeliverPolicy.All,
  });
  const wanted = new Set(msgIds);
  const out = new Map();
  const messages = await consumer.consume();
  const timer = setTimeout(() => messages.stop(), timeoutMs);
  for await (const m of messages) {
    const letter = m.json();
    if (wanted.has(letter.msg_id)) out.set(letter.msg_id, letter);
    if (out.size >= wanted.size) break;
  }
  clearTimeout(timer);
  await messages.close();
  return out;
}
