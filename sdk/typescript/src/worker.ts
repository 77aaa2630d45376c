// One function's consumer loop and the handling of each delivery, in the
// order of docs/protocol.md, "Handling a delivery": decode, already
// answered?, cancelled?, too late?, arguments, side effects, run, conclude.

import { headers as natsHeaders, type NatsConnection } from "@nats-io/transport-node";
import { JetStreamApiError, type Consumer, type ConsumerMessages, type JetStreamClient, type JetStreamManager, type JsMsg } from "@nats-io/jetstream";
import { context as otelContext, SpanKind, SpanStatusCode, trace, type Span, type Tracer } from "@opentelemetry/api";
import type { ValidateFunction } from "ajv";
import type { Cancels } from "./cancels.js";
import {
  CallCancelledError, DeadlineError, DidNotRunError, InvalidArgumentsError, RefusalError, RetryableError, ShutdownError,
} from "./errors.js";
import type { FunctionDef, Invocation } from "./function.js";
import { Backoff, consumerGone, Healer, sleep, type HealEnv } from "./heal.js";
import * as p from "./protocol.js";
import { extract, inject } from "./trace.js";

export interface Logger {
  info(msg: string, attrs?: object): void;
  warn(msg: string, attrs?: object): void;
  error(msg: string, attrs?: object): void;
}

/** What a worker shares with its executor: a healer's needs and more. */
export interface WorkerEnv extends HealEnv {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  name: string;
  ackWaitMs: number;
  apiPrefix: string;
  cancels: Cancels;
  tracer: Tracer;
  /** Aborted once the executor gives up waiting for running calls at shutdown. */
  shutdown: AbortSignal;
}

export interface Registered {
  def: FunctionDef;
  parametersText: string;
  digest: string;
  validate: ValidateFunction;
  concurrency: number;
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
}

const STALE_CALL_MS = 1_000;
const CRASH_ALLOWANCE = 2;
const ABANDON_GRACE_MS = 2_000;
const PERSIST_FOR_MS = 30_000;
const PULL_EXPIRES_MS = 5_000;

/** What one run of a handler came to. */
interface Outcome {
  res?: p.Result;
  retry?: boolean;
  refused?: boolean;
  panicked?: boolean;
  /** Shutdown cut the run short: hand the call back. */
  handBack?: boolean;
  didNotRun?: boolean;
}

export class Worker {
  private readonly running = new Map<string, Promise<void>>();
  private readonly inFlight = new Set<Promise<void>>();
  private stopping = false;
  private readonly stopped = new AbortController();
  private loops: Promise<void>[] = [];
  private readonly pulls = new Set<ConsumerMessages>();
  /** The consumer the loops pull from, looked up once per generation. */
  private consumer?: Promise<Consumer>;
  /** Counts the times the consumer was looked up afresh after a failure. */
  private generation = 0;
  /** The one recovery under way after a failed pull, which every loop awaits. */
  private recovering?: Promise<void>;
  private readonly healer: Healer;
  private readonly pullRetry = new Backoff(1_000, 5_000);

  constructor(private readonly env: WorkerEnv, private readonly fn: Registered) {
    this.healer = new Healer(env, fn.def.name, this.stopped.signal);
  }

  /** start runs `concurrency` pull loops: one call each at a time, so no call waits in a buffer. */
  start(): void {
    this.loops = Array.from({ length: this.fn.concurrency }, () => this.loop());
  }

  /**
   * stop stops pulling: the open pull requests are closed, so that the
   * server, finding no interest in them, hands no more calls to this
   * process (a call handed back would otherwise come back to another of its
   * pulls and spend a delivery). A call that slips through is handed back.
   */
  stop(): void {
    this.stopping = true;
    this.stopped.abort();
    for (const pull of this.pulls) void pull.close();
  }

  /** idle resolves when no call of this function runs. */
  async idle(): Promise<void> {
    while (this.inFlight.size) await Promise.allSettled([...this.inFlight]);
  }

  private async loop(): Promise<void> {
    while (!this.stopping) {
      const generation = this.generation;
      let m: JsMsg | null;
      try {
        this.consumer ??= this.env.js.consumers.get(p.callStream(this.env.team), this.fn.def.name);
        m = await this.pull(await this.consumer);
      } catch (e) {
        if (this.stopping || this.env.nc.isClosed()) break;
        // The loops that failed together recover once; a loop whose pull
        // began before the last recovery just pulls again.
        if (generation === this.generation) {
          this.recovering ??= this.recover(e)
            .catch((err) => this.env.log.error("recovering from a failed pull failed", { fn: this.fn.def.name, err: String(err) }))
            .finally(() => (this.recovering = undefined));
        }
        await this.recovering;
        continue;
      }
      this.pullRetry.reset();
      if (!m) continue;
      if (this.stopping) {
        m.nak(); // let another process have it now
        break;
      }
      const run = this.handle(m).catch((e) => this.env.log.error("handling a call failed", { fn: this.fn.def.name, err: String(e) }));
      this.inFlight.add(run);
      await run;
      this.inFlight.delete(run);
    }
  }

  /**
   * recover deals with a failed pull: a consumer the server shows gone is
   * recreated (Healer); otherwise the pull is tried again after a pause.
   */
  private async recover(err: unknown): Promise<void> {
    const { env, fn } = this;
    const gone = await consumerGone(env.jsm, env.team, fn.def.name, err);
    this.consumer = undefined;
    if (gone) {
      this.pullRetry.reset();
      await this.healer.heal(gone);
    } else {
      const wait = this.pullRetry.next();
      env.log.warn("pulling calls failed; pulling again", { fn: fn.def.name, err: String(err), in_ms: wait });
      await sleep(wait, this.stopped.signal);
    }
    this.generation++;
  }

  /** pull waits for one call (a pull request of one: only a free slot pulls), or null when none came. */
  private async pull(consumer: Consumer): Promise<JsMsg | null> {
    const it = await consumer.fetch({ max_messages: 1, expires: PULL_EXPIRES_MS });
    this.pulls.add(it);
    try {
      if (this.stopping) return null;
      for await (const m of it) return m;
      return null;
    } finally {
      this.pulls.delete(it);
    }
  }

  private async handle(m: JsMsg): Promise<void> {
    const { env, fn } = this;
    const attempt = m.info.deliveryCount;
    const storedMs = Number(m.info.timestampNanos) / 1e6;
    const replay = Number(m.headers?.get(p.HEADER_REPLAY) || 0) || 0;
    let call: p.Call;
    try {
      call = p.decodeCall(m.data);
      if (call.team !== env.team || call.function !== fn.def.name) {
        throw new Error(`call for ${call.team}/${call.function} arrived on ${m.subject}`);
      }
    } catch (e) {
      env.log.error("dropping malformed call", { subject: m.subject, size: m.data.length, err: String(e) });
      m.term("malformed call envelope");
      return;
    }
    const parent = extract(m.headers);
    const span = env.tracer.startSpan(`process ${p.callSubject(env.team, fn.def.name)}`, {
      kind: SpanKind.CONSUMER,
      attributes: {
        "messaging.system": "nats", "messaging.operation.type": "process", "messaging.destination.name": m.subject,
        "messaging.consumer.group.name": fn.def.name, "messaging.message.id": call.key,
        "gen_ai.tool.name": call.function, "gen_ai.tool.call.id": call.call_id, "toolrelay.attempt": attempt,
      },
    }, parent);
    const ctx = trace.setSpan(parent, span);
    const d = new Delivery(env, fn, m, call, attempt, replay, span, ctx);
    try {
      if (replay === 0 && (attempt > 1 || Date.now() - storedMs > STALE_CALL_MS) && (await this.resultRecorded(call))) {
        m.ack();
        return;
      }
      const mine = this.running.get(call.key);
      if (mine) {
        // Redelivered while this process still runs it: wait for that run.
        const hb = setInterval(() => m.working(), env.ackWaitMs / 3);
        await mine.catch(() => {});
        clearInterval(hb);
        if (await this.resultRecorded(call)) m.ack();
        else m.nak();
        return;
      }
      let release!: () => void;
      this.running.set(call.key, new Promise<void>((r) => (release = r)));
      try {
        await this.process(d);
      } finally {
        this.running.delete(call.key);
        release();
      }
    } finally {
      span.end();
    }
  }

  private async process(d: Delivery): Promise<void> {
    const { env, fn } = this;
    const { call, attempt, replay, m } = d;
    const why = env.cancels.cancelled(p.turnOf(call.key));
    if (why !== undefined && replay === 0) {
      return d.finish(d.fail("unavailable", `${call.function} was not run: it was cancelled before it started (${why}).`));
    }
    if (Date.now() >= Date.parse(call.deadline)) {
      return d.finish(d.fail("timeout",
        `${call.function} was not started: its deadline passed while it waited to run. Try again later or with a simpler request.`));
    }
    if (m.headers?.get(p.HEADER_SCHEMA) !== fn.digest && !fn.validate(call.arguments)) {
      env.log.warn("refusing call with invalid arguments", { call_key: call.key });
      return d.finish(d.fail("invalid_arguments", schemaProblem(call.function, fn.validate)));
    }
    if (attempt > fn.maxAttempts + CRASH_ALLOWANCE) {
      return d.finish(d.fail("unavailable",
        `${call.function} could not be completed: its executors stopped ${attempt - 1} times while running it. Continue without it.`),
        "undeliverable");
    }
    if (fn.def.sideEffects && replay === 0) {
      const go = await this.guardSideEffects(d);
      if (!go) return;
    }
    const o = await d.invoke(fn.def.handler);
    if (o.handBack) {
      m.nak(); // another process takes it at once; a side-effect mark stays "running"
      return;
    }
    const delay = backoff(fn, attempt);
    if (o.retry && replay === 0 && attempt < fn.maxAttempts && Date.parse(call.deadline) - Date.now() > delay + 1_000) {
      if (fn.def.sideEffects) {
        await d.mark("failed_retryable").catch((e) => env.log.warn("cannot record the failed attempt", { err: String(e) }));
      }
      env.log.info("retryable error; retrying", { call_key: call.key, delay_ms: delay, err: o.res?.error?.message });
      m.nak(delay);
      return;
    }
    return d.conclude(o);
  }

  /**
   * guardSideEffects keeps a side-effect function from running twice: it
   * reads the call's attempt mark from the bucket's leader, hands an
   * earlier attempt that may have run to reconcile (or fails the call), and
   * marks this attempt running by compare-and-set. It reports whether the
   * handler should run; when not, it has dealt with the delivery.
   */
  private async guardSideEffects(d: Delivery): Promise<boolean> {
    const { env, fn } = this;
    let rev = 0;
    let mayHaveRun = false;
    try {
      const sm = await env.jsm.streams.getMessage(`KV_${p.ATTEMPT_BUCKET}`, { last_by_subj: p.attemptSubject(d.call.key) });
      if (sm && sm.header?.get("KV-Operation") !== "DEL" && sm.header?.get("KV-Operation") !== "PURGE") {
        rev = sm.seq;
        try {
          mayHaveRun = (sm.json<p.AttemptMark>()).state !== "failed_retryable";
        } catch {
          mayHaveRun = true; // unreadable: assume the worst
        }
      } else if (sm) rev = sm.seq;
    } catch (e) {
      env.log.warn("cannot tell whether an earlier attempt ran; retrying later", { err: String(e) });
      d.m.nak(1_000);
      return false;
    }
    if (mayHaveRun) {
      if (!fn.def.reconcile) {
        env.log.warn("an earlier attempt may have run; not re-running a side-effect function", { call_key: d.call.key });
        await d.finish(d.fail("unavailable",
          `${d.call.function} may have run already (an earlier attempt was interrupted) and was not retried, to avoid doing it twice. Check whether its effect happened before calling it again.`),
          "may_have_run");
        return false;
      }
      const o = await d.invoke(fn.def.reconcile);
      if (o.handBack) {
        d.m.nak();
        return false;
      }
      if (!o.didNotRun) {
        await d.conclude(o);
        return false;
      }
      env.log.info("reconcile found no effect; running the call", { call_key: d.call.key });
    }
    try {
      await d.mark("running", rev);
    } catch (e) {
      if (e instanceof JetStreamApiError && (e.code === 10071 || e.code === 10164)) {
        // Another delivery marked itself running meanwhile: leave the call
        // to it, unacknowledged, so that should it die too the next
        // delivery finds its mark.
        env.log.warn("another attempt of this call started meanwhile; leaving the call to it", { call_key: d.call.key });
        return false;
      }
      env.log.warn("cannot record the attempt; retrying later", { err: String(e) });
      d.m.nak(1_000);
      return false;
    }
    return true;
  }

  /** resultRecorded looks the call's result up by direct get; a failed lookup counts as none. */
  private async resultRecorded(call: p.Call): Promise<boolean> {
    const subj = `${this.env.apiPrefix}.DIRECT.GET.${p.resultStream(call.team)}.${p.resultSubject(call.team, call.key)}`;
    try {
      const r = await this.env.nc.request(subj, undefined, { timeout: 2_000 });
      const status = r.headers?.code ?? 0;
      if (!status && r.headers?.get("Nats-Sequence")) return true;
      if (status !== 404) this.env.log.warn("cannot tell whether the call's result is recorded; running it", { status });
      return false;
    } catch (e) {
      if (String(e).includes("404")) return false;
      this.env.log.warn("cannot tell whether the call's result is recorded; running it", { err: String(e) });
      return false;
    }
  }
}

/** backoff is the delay before attempt+1: initial·2^(attempt-1), capped, ±20% jitter. */
function backoff(fn: Registered, attempt: number): number {
  const d = Math.min(fn.initialBackoffMs * 2 ** (attempt - 1), Math.max(fn.maxBackoffMs, fn.initialBackoffMs));
  return Math.round(d * (0.8 + Math.random() * 0.4));
}

function schemaProblem(fn: string, v: ValidateFunction): string {
  const e = v.errors?.[0];
  const where = e?.instancePath ? `at ${e.instancePath}` : "at the top level";
  const detail = e ? `${where}: ${e.message}${e.params && "additionalProperty" in e.params ? ` (${String(e.params.additionalProperty)})` : ""}` : "";
  return `The arguments do not match the parameters of ${fn} ${detail}. Fix them and call it again.`;
}

const crashTypes = [TypeError, ReferenceError, RangeError, SyntaxError];

/** One delivery of a call, carried to its end. */
class Delivery {
  constructor(
    readonly env: WorkerEnv,
    readonly fn: Registered,
    readonly m: JsMsg,
    readonly call: p.Call,
    readonly attempt: number,
    readonly replay: number,
    readonly span: Span,
    readonly ctx: ReturnType<typeof trace.setSpan>,
  ) {}

  fail(type: p.ErrorCode, message: string): p.Result {
    return p.failure(this.call, type, message, this.env.name, this.attempt);
  }

  /** invoke runs h under the call's deadline, reporting progress, and maps what it did to an outcome. */
  async invoke(h: FunctionDef["handler"]): Promise<Outcome> {
    const { env, fn, call, m } = this;
    const deadlineMs = Math.min(Date.parse(call.deadline), fn.def.timeoutMs ? Date.now() + fn.def.timeoutMs : Infinity);
    const deadline = new Date(deadlineMs);
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new DeadlineError(deadline)), Math.max(deadlineMs - Date.now(), 0));
    const onShutdown = () => ac.abort(new ShutdownError());
    if (env.shutdown.aborted) onShutdown();
    env.shutdown.addEventListener("abort", onShutdown);
    const untrack = env.cancels.track(call.key, ac);
    const hb = setInterval(() => m.working(), env.ackWaitMs / 3);
    const inv: Invocation = { call, attempt: this.attempt, signal: ac.signal, deadline, replay: this.replay || undefined, context: this.ctx };
    const started = new Date();
    let abandon: NodeJS.Timeout | undefined;
    let out: { ok: true; value: unknown } | { ok: false; err: unknown };
    try {
      const run = otelContext.with(this.ctx, () => Promise.resolve().then(() => h(call.arguments, inv)));
      const gaveUp = new Promise<never>((_, reject) => {
        // A handler that ignores its signal is abandoned shortly after the
        // deadline (so the call still gets its timeout result), or after a
        // shutdown abort.
        const giveUp = () => { abandon = setTimeout(() => reject(ac.signal.reason), ABANDON_GRACE_MS); };
        if (ac.signal.aborted) giveUp();
        else ac.signal.addEventListener("abort", giveUp, { once: true });
      });
      out = { ok: true, value: await Promise.race([run, gaveUp]) };
    } catch (err) {
      out = { ok: false, err };
    } finally {
      clearTimeout(timer);
      clearTimeout(abandon);
      clearInterval(hb);
      untrack();
      env.shutdown.removeEventListener("abort", onShutdown);
    }
    const reason = ac.signal.reason;
    if (reason instanceof ShutdownError) return { handBack: true };
    const res: p.Result = {
      v: p.VERSION, key: call.key, call_id: call.call_id, team: call.team, function: call.function,
      executor: env.name, attempt: this.attempt, started_at: started.toISOString(), finished_at: "",
    };
    const done = (o: Outcome) => {
      res.finished_at = new Date().toISOString();
      return { res, ...o };
    };
    const failWith = (type: p.ErrorCode, message: string) => {
      res.error = { type, message: p.truncate(message, 4096) };
    };
    if (reason instanceof CallCancelledError) {
      failWith("unavailable", `${call.function} was cancelled: ${reason.reason}.`);
      return done({});
    }
    if (!out.ok) {
      const err = out.err;
      if (err instanceof DidNotRunError) return { didNotRun: true };
      if (reason instanceof DeadlineError) {
        failWith("timeout", `${call.function} timed out after ${Date.now() - started.getTime()}ms. Try a narrower request, or continue without this result.`);
        return done({});
      }
      if (err instanceof InvalidArgumentsError) {
        failWith("invalid_arguments", err.message);
        return done({});
      }
      if (!(err instanceof Error) || crashTypes.some((t) => err.constructor === t)) {
        env.log.error("handler crashed", { call_key: call.key, err: err instanceof Error ? err.stack : String(err) });
        failWith("function_error", `${call.function} failed with an internal error. Do not call it again with the same arguments.`);
        return done({ panicked: true });
      }
      failWith("function_error", err.message || `${call.function} failed.`);
      if (err instanceof RefusalError) return done({ refused: true });
      return done({ retry: err instanceof RetryableError });
    }
    const v = out.value;
    const text = typeof v === "string" ? v : v instanceof Uint8Array ? new TextDecoder().decode(v) : JSON.stringify(v ?? null);
    res.output = p.truncate(text, p.MAX_OUTPUT_SIZE);
    return done({});
  }

  /** conclude records a run's final outcome, with a dead letter when it failed for good. */
  conclude(o: Outcome): Promise<void> {
    let reason: p.DeadLetterReason | undefined;
    if (o.panicked) reason = "panic";
    else if (o.retry) reason = "attempts_exhausted";
    else if (!o.refused && o.res?.error?.type === "function_error") reason = "permanent_error";
    return this.finish(o.res!, reason);
  }

  /**
   * finish records the dead letter (if any) and then the result, first
   * result wins, and acks. A replay's outcome goes to the dead letters
   * only. What cannot be recorded leaves the call for redelivery.
   */
  async finish(res: p.Result, reason?: p.DeadLetterReason): Promise<void> {
    const { env, call, m, span } = this;
    try {
      if (this.replay > 0) {
        await this.persist(() => this.deadLetter(res, "replayed"));
        m.ack();
        return;
      }
      if (reason) {
        await this.persist(() => this.deadLetter(res, reason));
        span.addEvent("dead letter", { "toolrelay.reason": reason });
      }
      if (res.error) span.setStatus({ code: SpanStatusCode.ERROR, message: res.error.type });
      await this.persist(() => this.record(res));
    } catch (e) {
      env.log.error("could not record the outcome; the call will be redelivered", { call_key: call.key, err: String(e) });
      m.nak(1_000);
      return;
    }
    m.ack();
    if (res.error) env.log.info("call failed", { call_key: call.key, code: res.error.type, dead_letter: reason ?? "" });
  }

  private async record(res: p.Result): Promise<void> {
    const h = natsHeaders();
    h.set(p.HEADER_CALL_KEY, res.key);
    const send = this.env.tracer.startSpan(`send fnresult.${this.env.team}`, { kind: SpanKind.PRODUCER }, this.ctx);
    inject(trace.setSpan(this.ctx, send), h);
    const publish = (ttl: string | undefined) => this.env.js.publish(p.resultSubject(res.team, res.key), JSON.stringify(res), {
      msgID: res.key, expect: { lastSubjectSequence: 0 }, headers: h, ...(ttl ? { ttl } : {}),
    });
    try {
      const ttl = p.resultTTL(this.call);
      try {
        await publish(ttl);
      } catch (e) {
        // 10166: the stream does not take per-message TTLs yet (its dispatcher
        // has not updated it); the result is recorded without, kept for MaxAge.
        if (!(ttl && e instanceof JetStreamApiError && e.code === 10166)) throw e;
        await publish(undefined);
      }
    } catch (e) {
      // 10071: a result is recorded already (first wins). That is success.
      if (!(e instanceof JetStreamApiError && e.code === 10071)) throw e;
    } finally {
      send.end();
    }
  }

  private async deadLetter(res: p.Result, reason: p.DeadLetterReason): Promise<void> {
    const dl: p.DeadLetter = {
      v: p.VERSION, call: this.call, result: res, reason, attempts: this.attempt, executor: this.env.name,
      at: new Date().toISOString(), ...(this.replay > 0 ? { replay: this.replay } : {}),
    };
    const h = natsHeaders();
    h.set(p.HEADER_CALL_KEY, this.call.key);
    const msgID = this.replay > 0 ? `dlq.${this.call.key}.r${this.replay}` : `dlq.${this.call.key}`;
    await this.env.js.publish(p.deadLetterSubject(this.call.team, this.call.function, this.call.key), JSON.stringify(dl), { msgID, headers: h });
  }

  /** mark writes the call's attempt mark: by compare-and-set on rev for "running", plainly otherwise. */
  async mark(state: p.AttemptMark["state"], rev?: number): Promise<void> {
    const mark: p.AttemptMark = { state, attempt: this.attempt, executor: this.env.name, at: new Date().toISOString() };
    await this.env.js.publish(p.attemptSubject(this.call.key), JSON.stringify(mark),
      rev === undefined ? undefined : { expect: { lastSubjectSequence: rev } });
  }

  /** persist retries publish with backoff until it succeeds, reporting progress, up to the deadline (at least 30s). */
  private async persist(publish: () => Promise<void>): Promise<void> {
    const giveUp = Math.max(Date.parse(this.call.deadline), Date.now() + PERSIST_FOR_MS);
    let wait = 100;
    for (;;) {
      try {
        return await publish();
      } catch (e) {
        if (this.env.nc.isClosed() || Date.now() + wait > giveUp) throw e;
        this.env.log.warn("recording the outcome failed; retrying", { err: String(e), in_ms: wait });
        this.m.working();
        await sleep(wait);
        wait = Math.min(wait * 2, 2_000, this.env.ackWaitMs / 3);
      }
    }
  }
}
