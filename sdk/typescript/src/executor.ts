// Executor serves one team's functions from JetStream, following
// docs/protocol.md. Many processes may serve the same functions: they share
// one durable consumer per function, so each call runs on one of them.

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import { trace, type TracerProvider } from "@opentelemetry/api";
import { Ajv2020 } from "ajv/dist/2020.js";
import { Cancels } from "./cancels.js";
import { Lease } from "./declare.js";
import { schemaDigest } from "./digest.js";
import type { Approval, FunctionDef, RetryPolicy } from "./function.js";
import * as p from "./protocol.js";
import * as prov from "./provision.js";
import { Worker, type Logger, type Registered } from "./worker.js";


export interface Options {
  /** Names this process in results, dead letters and logs. Default: "<hostname>-<random>". */
  name?: string;
  /** How long JetStream waits before redelivering a silent call; progress is sent every third. Default: 30s. */
  ackWaitMs?: number;
  /** How long shutdown waits for running calls before aborting them (ShutdownError) and handing them back. Default: 10s. */
  shutdownTimeoutMs?: number;
  /** Retry policy of functions that set none. Default: 3 attempts, 200ms doubling to 10s. */
  retry?: RetryPolicy;
  /**
   * Where this team's account reaches the control plane's JetStream API
   * (CONTROL_API_PREFIX, with an account per team). Default: none: the
   * account is shared, results are looked up under $JS.API, and the team's
   * results stream is created if no dispatcher has yet.
   */
  controlAPIPrefix?: string;
  /** Replicas of the streams and buckets the executor creates. Default: 1. */
  replicas?: number;
  /** Receives logs. Default: JSON lines on stderr for warnings and errors. */
  logger?: Logger;
  /** Receives the process and send spans. Default: the global OpenTelemetry tracer provider. */
  tracerProvider?: TracerProvider;
}

const defaultLogger: Logger = {
  info: () => {},
  warn: (msg, attrs) => console.error(JSON.stringify({ level: "warn", msg, ...attrs })),
  error: (msg, attrs) => console.error(JSON.stringify({ level: "error", msg, ...attrs })),
};

type State = "new" | "starting" | "serving" | "stopping" | "stopped";

export class Executor {
  readonly name: string;
  /** Identifies this process run in its declarations. */
  readonly instance = randomUUID();
  private readonly opts: Required<Pick<Options, "ackWaitMs" | "shutdownTimeoutMs" | "replicas">> & Options;
  private readonly funcs = new Map<string, Registered>();
  private readonly log: Logger;
  private state: State = "new";
  private js!: JetStreamClient;
  private jsm!: JetStreamManager;
  private workers: Worker[] = [];
  private lease?: Lease;
  private readonly cancels = new Cancels();
  private readonly shutdownAbort = new AbortController();
  private stopped?: Promise<void>;

  /** New executor of team's functions on nc (which the caller owns and closes). */
  constructor(private readonly nc: NatsConnection, readonly team: string, options: Options = {}) {
    if (!p.validTeam(team)) throw new Error(`toolrelay: invalid team name ${JSON.stringify(team)}: want ^[a-z0-9][a-z0-9_-]{0,31}$`);
    this.opts = { ackWaitMs: p.DEFAULT_ACK_WAIT_MS, shutdownTimeoutMs: 10_000, replicas: 1, ...options };
    this.name = options.name ?? `${hostname()}-${randomUUID().slice(0, 8)}`;
    this.log = options.logger ?? defaultLogger;
  }

  /** register adds a function; call it before start. It throws on an invalid name or schema. */
  register<A = any, R = unknown>(def: FunctionDef<A, R>): this {
    if (this.state !== "new") throw new Error(`toolrelay: register ${def.name}: executor already started`);
    if (!p.validFunction(def.name)) throw new Error(`toolrelay: invalid function name ${JSON.stringify(def.name)}: want ^[a-zA-Z0-9_-]{1,64}$`);
    if (this.funcs.has(def.name)) throw new Error(`toolrelay: function ${def.name} registered twice`);
    if (typeof def.handler !== "function") throw new Error(`toolrelay: function ${def.name} has no handler`);
    if (def.reconcile && !def.sideEffects) throw new Error(`toolrelay: function ${def.name}: reconcile is only for sideEffects functions`);
    const text = def.parameters === undefined ? `{"type":"object","properties":{}}`
      : typeof def.parameters === "string" ? def.parameters.trim() : JSON.stringify(def.parameters);
    let schema: unknown;
    try {
      schema = JSON.parse(text);
    } catch (e) {
      throw new Error(`toolrelay: function ${def.name}: parameters are not JSON: ${String(e)}`);
    }
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      throw new Error(`toolrelay: function ${def.name}: parameters must be a JSON Schema object`);
    }
    const top = (schema as { type?: unknown }).type;
    if (top !== undefined && top !== "object") {
      throw new Error(`toolrelay: function ${def.name}: the top level must be an object schema ("type": "object"): arguments always arrive as one JSON object`);
    }
    let validate;
    try {
      validate = new Ajv2020({ strict: false, allErrors: false, validateFormats: false }).compile(schema as object);
    } catch (e) {
      throw new Error(`toolrelay: function ${def.name}: parameters: ${String(e)}`);
    }
    if (def.outputSchema !== undefined) {
      const o = def.outputSchema as { type?: unknown };
      if (typeof o !== "object" || o === null || Array.isArray(o) || (o.type !== undefined && o.type !== "object")) {
        throw new Error(`toolrelay: function ${def.name}: outputSchema must be a JSON Schema of an object ("type": "object")`);
      }
    }
    if ((def.icons?.length ?? 0) > 4) throw new Error(`toolrelay: function ${def.name}: ${def.icons!.length} icons; at most 4`);
    for (const ic of def.icons ?? []) {
      if (!ic.src.startsWith("https://") && !ic.src.startsWith("data:image/")) {
        throw new Error(`toolrelay: function ${def.name}: icon src must be an https: or data:image/ URL, not ${JSON.stringify(ic.src.slice(0, 40))}`);
      }
    }
    if (def.approval !== undefined && def.approval !== "required") {
      const a = def.approval;
      if (typeof a !== "object" || a === null || Boolean(a.required) === Boolean(a.when?.trim())) {
        throw new Error(`toolrelay: function ${def.name}: approval: set either "required", { required: true } or { when: "<CEL condition over args>" }`);
      }
      if ((a.when?.length ?? 0) > 1024) throw new Error(`toolrelay: function ${def.name}: approval: when is over 1024 bytes`);
      if ((a.approvers?.length ?? 0) > 16) throw new Error(`toolrelay: function ${def.name}: approval: at most 16 approvers`);
    }
    const retry = { ...this.opts.retry, ...def.retry };
    this.funcs.set(def.name, {
      def: def as FunctionDef, parametersText: text, digest: schemaDigest(text), validate,
      concurrency: def.concurrency ?? 8,
      maxAttempts: retry.maxAttempts ?? 3, initialBackoffMs: retry.initialBackoffMs ?? 200, maxBackoffMs: retry.maxBackoffMs ?? 10_000,
    });
    return this;
  }

  /** digest returns the schema digest of a registered function (as on the calls the dispatcher checked). */
  digest(fn: string): string | undefined {
    return this.funcs.get(fn)?.digest;
  }

  /**
   * start provisions the team's streams and one consumer per function,
   * follows cancellations, starts pulling, and declares the functions (a
   * lease renewed while the executor serves). It resolves once the
   * executor serves; it rejects with a DeclarationRefusedError when the
   * dispatchers refuse a declaration (another team owns the name), having
   * stopped everything. A dispatcher that does not answer yet is not a
   * refusal: renewals reach the first one that starts. A function whose
   * consumer or stream disappears later is recreated, or, where it cannot
   * be, not declared until it exists again (heal.ts).
   */
  async start(): Promise<void> {
    if (this.state !== "new") throw new Error("toolrelay: start called twice");
    if (this.funcs.size === 0) throw new Error("toolrelay: no functions registered");
    this.state = "starting";
    this.js = jetstream(this.nc);
    this.jsm = await jetstreamManager(this.nc);
    await this.provision();
    await this.cancels.follow(this.js, this.team);
    const env = {
      nc: this.nc, js: this.js, jsm: this.jsm, team: this.team, name: this.name, ackWaitMs: this.opts.ackWaitMs,
      apiPrefix: this.opts.controlAPIPrefix || p.DEFAULT_API_PREFIX, cancels: this.cancels,
      tracer: (this.opts.tracerProvider ?? trace.getTracerProvider()).getTracer("toolrelay-executor-ts"),
      log: this.log, shutdown: this.shutdownAbort.signal,
      provision: (fn: string) => this.provision([fn]),
      suspend: (fn: string) => lease.suspend(fn),
      resume: (fn: string) => lease.resume(fn),
    };
    const started = new Date().toISOString();
    const decls = new Map<string, string>();
    for (const f of this.funcs.values()) decls.set(f.def.name, this.declaration(f, started));
    // The lease exists before the workers, so a worker that loses its
    // consumer at once holds its function back from the first declaration.
    const lease = new Lease(this.nc, this.team, decls, (msg, extra) => this.log.warn(msg, extra));
    this.lease = lease;
    this.workers = [...this.funcs.values()].map((f) => new Worker(env, f));
    for (const w of this.workers) w.start();
    try {
      await this.lease.declare();
    } catch (e) {
      await this.lease.withdraw();
      for (const w of this.workers) w.stop();
      this.cancels.stop();
      this.state = "stopped";
      throw e;
    }
    this.lease.renew();
    this.state = "serving";
    this.log.info("executor serving", { team: this.team, functions: this.funcs.size, instance: this.instance });
  }

  /**
   * shutdown stops serving, in this order: stop pulling; withdraw the
   * declarations, so dispatchers stop counting this process; wait up to
   * shutdownTimeoutMs for running calls; then abort the rest (their signal's
   * reason is a ShutdownError) and hand them back with a nak, so another
   * process takes them at once. It resolves when done; calling it again
   * returns the same promise. The connection stays open (the caller owns it).
   */
  shutdown(): Promise<void> {
    this.stopped ??= this.doShutdown();
    return this.stopped;
  }

  private async doShutdown(): Promise<void> {
    if (this.state === "new" || this.state === "stopped") {
      this.state = "stopped";
      return;
    }
    this.state = "stopping";
    const deadline = Date.now() + this.opts.shutdownTimeoutMs;
    for (const w of this.workers) w.stop();
    await this.lease?.withdraw();
    const idle = Promise.all(this.workers.map((w) => w.idle()));
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((r) => (timer = setTimeout(() => r("late"), Math.max(deadline - Date.now(), 0))));
    if ((await Promise.race([idle, late])) === "late") {
      this.log.warn("shutdown timeout: aborting running calls; they are handed back", { timeout_ms: this.opts.shutdownTimeoutMs });
      this.shutdownAbort.abort();
      await idle;
    }
    clearTimeout(timer);
    this.cancels.stop();
    this.state = "stopped";
  }

  private declaration(f: Registered, started: string): string {
    const d = f.def;
    const spec: Record<string, unknown> = {
      v: p.VERSION, name: d.name, ...(d.description ? { description: d.description } : {}),
      parameters: "\u0000PARAMETERS\u0000", team: this.team,
      ...(d.timeoutMs ? { timeout: `${d.timeoutMs}ms` } : {}),
      max_concurrency: d.maxConcurrency ?? 1000,
      ...(d.sideEffects ? { side_effects: true } : {}),
      ...(d.version ? { function_version: d.version } : {}),
      ...(d.deferLoading ? { defer_loading: true } : {}),
      ...(d.title ? { title: d.title } : {}),
      ...(d.icons?.length ? {
        icons: d.icons.map((ic) => ({
          src: ic.src, ...(ic.mimeType ? { mime_type: ic.mimeType } : {}),
          ...(ic.sizes?.length ? { sizes: ic.sizes } : {}), ...(ic.theme ? { theme: ic.theme } : {}),
        })),
      } : {}),
      ...(d.outputSchema ? { output_schema: d.outputSchema } : {}),
      ...(d.approval ? { approval: approvalSpec(d.approval) } : {}),
      updated_at: started,
    };
    const text = JSON.stringify({ v: p.VERSION, spec, instance: this.instance, executor: this.name, started_at: started });
    // The schema goes in as the text the digest was computed over.
    return text.replace(JSON.stringify("\u0000PARAMETERS\u0000"), () => f.parametersText);
  }

  private async provision(only?: string[]): Promise<void> {
    const r = this.opts.replicas;
    await prov.ensureStream(this.jsm, prov.callStreamConfig(this.team, r));
    if (!this.opts.controlAPIPrefix) await prov.ensureStream(this.jsm, prov.resultStreamConfig(this.team, r));
    await prov.ensureStream(this.jsm, prov.deadLetterStreamConfig(r));
    await prov.ensureStream(this.jsm, prov.cancelStreamConfig(r));
    if ([...this.funcs.values()].some((f) => f.def.sideEffects)) await prov.ensureStream(this.jsm, prov.attemptBucketConfig(r));
    for (const f of this.funcs.values()) {
      if (only && !only.includes(f.def.name)) continue;
      await prov.ensureConsumer(this.jsm, this.team, f.def.name, f.def.maxConcurrency ?? 1000, this.opts.ackWaitMs);
    }
  }
}

/** The declaration's form of a function's approval policy. */
function approvalSpec(a: "required" | Approval): { required?: true; when?: string; approvers?: string[] } {
  if (a === "required") return { required: true };
  return {
    ...(a.required ? { required: true as const } : {}),
    ...(a.when ? { when: a.when } : {}),
    ...(a.approvers?.length ? { approvers: a.approvers } : {}),
  };
}
