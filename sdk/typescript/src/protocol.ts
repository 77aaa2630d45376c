// Names, subjects, headers, envelopes and settings of docs/protocol.md, the
// wire contract this library implements. pkg/protocol is the Go original.

export const VERSION = 1;

export const HEADER_CALL_KEY = "Toolrelay-Call-Key";
export const HEADER_DEADLINE = "Toolrelay-Deadline";
export const HEADER_FUNCTION = "Toolrelay-Function";
export const HEADER_SCHEMA = "Toolrelay-Schema";
export const HEADER_REPLAY = "Toolrelay-Replay";
export const HEADER_MSG_ID = "Nats-Msg-Id";

export const MAX_OUTPUT_SIZE = 256 << 10;
export const LEASE_TTL_MS = 15_000;
export const LEASE_RENEWAL_MS = 5_000;
/** How long to wait for the answer to one declare request before sending it again. */
export const DECLARE_WAIT_MS = 6_000;
export const CANCEL_MEMORY_MS = 30 * 60_000;
export const DEFAULT_ACK_WAIT_MS = 30_000;
/** The most a result is kept: the result streams' MaxAge, and the longest Nats-TTL resultTTL gives. */
export const RESULT_MAX_AGE_MS = 2 * 60 * 60_000;
/** The shortest Nats-TTL of a result: it answers a redelivery's recorded-result check. */
export const RESULT_MIN_TTL_MS = 60_000;
export const DEFAULT_API_PREFIX = "$JS.API";
/** Where a team's account reaches the control plane's API, with an account per team. */
export const CONTROL_API_PREFIX = "$JS.toolrelay.API";
export const MAX_DECLARATIONS = 256;
/** The most bytes of one envelope (a declare request too): NATS' default max_payload. */
export const MAX_ENVELOPE_SIZE = 1 << 20;

export const DEAD_LETTER_STREAM = "FNDLQ";
export const CANCEL_STREAM = "FNCANCELS";
export const ATTEMPT_BUCKET = "toolrelay_attempts";

const teamRE = /^[a-z0-9][a-z0-9_-]{0,31}$/;
const functionRE = /^[a-zA-Z0-9_-]{1,64}$/;
const callKeyRE = /^[0-9a-f]{32}\.[0-9a-f]{16}$/;

export function validTeam(team: string): boolean {
  return teamRE.test(team);
}
export function validFunction(name: string): boolean {
  return functionRE.test(name);
}
export function validCallKey(key: string): boolean {
  return callKeyRE.test(key);
}

export const callStream = (team: string) => `FNCALLS_${team}`;
export const resultStream = (team: string) => `FNRESULTS_${team}`;
export const callSubject = (team: string, fn: string) => `fncall.${team}.${fn}`;
export const resultSubject = (team: string, key: string) => `fnresult.${team}.${key}`;
export const declareSubject = (team: string) => `toolrelay.declare.${team}`;
export const cancelFilter = (team: string) => `fncancel.${team}.*`;
/**
 * Where a call's dead letters go. docs/protocol.md says fndlq.<team>.<function>;
 * the Go executor (and `executor dlq`, which looks a call's records up by
 * subject) writes fndlq.<team>.<function>.<call key>, which the same
 * fndlq.> stream and permissions cover. This library follows the Go executor.
 */
export const deadLetterSubject = (team: string, fn: string, key: string) => `fndlq.${team}.${fn}.${key}`;
export const attemptSubject = (key: string) => `$KV.${ATTEMPT_BUCKET}.${key}`;
export const turnOf = (key: string) => key.split(".")[0]!;

/** Error codes of failed results (append-only). */
export type ErrorCode = "timeout" | "invalid_arguments" | "unknown_function" | "unavailable" | "function_error" | "denied";

/** A call as the dispatcher publishes it. */
export interface Call {
  v: number;
  key: string;
  platform: string;
  scope: string;
  call_id: string;
  team: string;
  function: string;
  arguments: unknown;
  deadline: string;
  created_at: string;
  /** How long the dispatcher reads the result: it is recorded with resultTTL as its Nats-TTL. */
  keep_result_until?: string;
}

export interface Result {
  v: number;
  key: string;
  call_id: string;
  team: string;
  function: string;
  output?: string;
  error?: { type: ErrorCode; message: string };
  executor?: string;
  attempt?: number;
  started_at?: string;
  finished_at: string;
}

export interface DeadLetter {
  v: number;
  call: Call;
  result: Result;
  reason: DeadLetterReason;
  attempts: number;
  executor?: string;
  at: string;
  replay?: number;
}

export type DeadLetterReason =
  | "permanent_error"
  | "panic"
  | "attempts_exhausted"
  | "may_have_run"
  | "undeliverable"
  | "replayed";

export interface AttemptMark {
  state: "running" | "failed_retryable";
  attempt: number;
  executor: string;
  at: string;
}

/** decodeCall parses a call body, or throws saying what is wrong with it. */
export function decodeCall(data: Uint8Array): Call {
  const c = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(data)) as Call;
  if (typeof c !== "object" || c === null) throw new Error("call is not a JSON object");
  if (typeof c.v !== "number" || c.v < 1 || c.v > VERSION) throw new Error(`call version ${c.v} not supported`);
  if (typeof c.key !== "string" || !validCallKey(c.key)) throw new Error(`malformed call key ${JSON.stringify(c.key)}`);
  if (typeof c.call_id !== "string" || c.call_id === "") throw new Error("call has no call_id");
  if (typeof c.team !== "string" || !validTeam(c.team)) throw new Error("call has an invalid team");
  if (typeof c.function !== "string" || !validFunction(c.function)) throw new Error("call has an invalid function");
  if (typeof c.deadline !== "string" || Number.isNaN(Date.parse(c.deadline))) throw new Error("call has no valid deadline");
  if (c.arguments === undefined) throw new Error("call has no arguments");
  if (c.keep_result_until !== undefined && (typeof c.keep_result_until !== "string" || Number.isNaN(Date.parse(c.keep_result_until)))) {
    throw new Error("call has an invalid keep_result_until");
  }
  return c;
}

/**
 * resultTTL is the Nats-TTL of call's result recorded at nowMs: until keep_result_until, at least
 * RESULT_MIN_TTL_MS and at most RESULT_MAX_AGE_MS, in whole seconds rounded up ("1200s"); undefined
 * when the call names no keep_result_until (the result is then kept for the stream's MaxAge).
 */
export function resultTTL(call: Call, nowMs: number = Date.now()): string | undefined {
  if (call.keep_result_until === undefined) return undefined;
  const ms = Math.min(Math.max(Date.parse(call.keep_result_until) - nowMs, RESULT_MIN_TTL_MS), RESULT_MAX_AGE_MS);
  return `${Math.ceil(ms / 1000)}s`;
}

/** failure is a failed result of call. */
export function failure(call: Call, type: ErrorCode, message: string, executor?: string, attempt?: number): Result {
  return {
    v: VERSION, key: call.key, call_id: call.call_id, team: call.team, function: call.function,
    error: { type, message }, executor, attempt, finished_at: new Date().toISOString(),
  };
}

/**
 * truncate cuts s to at most limit UTF-8 bytes, between characters, with
 * the marker the Go executor appends (protocol.Truncate).
 */
export function truncate(s: string, limit: number): string {
  const b = Buffer.from(s, "utf8");
  if (b.length <= limit) return s;
  const marker = (kept: number) => `\n[toolrelay: output truncated: first ${kept} of ${b.length} bytes shown]`;
  const room = limit - Buffer.byteLength(marker(b.length));
  let keep = Math.max(room, 0);
  while (keep > 0 && (b[keep]! & 0xc0) === 0x80) keep--;
  return room < 0 ? b.subarray(0, keep).toString("utf8") : b.subarray(0, keep).toString("utf8") + marker(keep);
}
