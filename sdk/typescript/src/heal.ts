// A function's consumer can disappear under a running executor: an operator
// deletes it or recreates the team's stream, a stream is restored or moved,
// a server starts again on a fresh store. A pull says so plainly only when
// the server deleted the consumer under it (409 "consumer deleted"); a
// consumer that no longer exists on the server shows otherwise as a failed
// pull or missing heartbeats. So every such sign is checked against the
// server (consumerGone), and a consumer that is gone is recreated with what
// it needs (Healer). Where that is not possible (the process may not create
// streams or consumers, or what exists now is incompatible), the function's
// declaration is withdrawn, with an error in the log, so no dispatcher counts
// it served, and the healer keeps trying until the consumer is back; then
// the function is declared again. This is pkg/exec's heal.go, in TypeScript.

import { errors as natsErrors } from "@nats-io/transport-node";
import { JetStreamApiError, type JetStreamManager } from "@nats-io/jetstream";
import * as p from "./protocol.js";
import type { Logger } from "./worker.js";

/** How long a consumer may stay missing before its function's declaration is withdrawn, while every failure may pass. */
export const HEAL_WITHDRAW_AFTER_MS = 3_000;
/** How long to wait before recreating a consumer found gone: a deletion under way finishes first. */
const HEAL_SETTLE_MS = 1_000;
/** Gone again within this long of being recreated: wait a growing delay first, not to race whoever removes it. */
const HEAL_AGAIN_MS = 60_000;

const CONSUMER_NOT_FOUND = 10014;
const STREAM_NOT_FOUND = 10059;

/** A growing delay with up to a quarter off at random, as internal/backoff. */
export class Backoff {
  private cur = 0;
  constructor(private readonly initialMs: number, private readonly maxMs: number) {}
  next(): number {
    this.cur = this.cur === 0 ? this.initialMs : Math.min(this.cur * 2, this.maxMs);
    return jitter(this.cur);
  }
  reset(): void {
    this.cur = 0;
  }
}

const jitter = (ms: number) => Math.round(ms * (1 - Math.random() / 4));

/** sleep waits ms, or less when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal?.addEventListener("abort", done);
  });
}

/**
 * mayPass reports whether a JetStream failure may pass by itself: a request
 * that timed out or found no responder (a server away), or the server
 * answering that it is temporarily unavailable (a leader being elected).
 * Anything else (no permission, an incompatible stream) will not.
 */
export function mayPass(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof natsErrors.TimeoutError || e instanceof natsErrors.NoRespondersError) return true;
    if (e instanceof natsErrors.PermissionViolationError) return false;
    if (e instanceof JetStreamApiError) return e.status === 503;
  }
  return false;
}

/** deletedUnderPull reports whether a pull ended because the server deleted its consumer or stream. */
function deletedUnderPull(err: unknown): boolean {
  const e = err as { name?: string; code?: unknown; message?: string };
  return e?.name === "JetStreamStatusError" && e.code === 409 && /^(consumer|stream) deleted$/i.test(e.message ?? "");
}

/**
 * consumerGone asks the server whether fn's consumer still exists after a
 * pull failed with err, and returns what shows it gone, or undefined when
 * it exists or the server does not say (no answer is no proof).
 */
export async function consumerGone(jsm: JetStreamManager, team: string, fn: string, err: unknown): Promise<Error | undefined> {
  if (deletedUnderPull(err)) return err as Error;
  try {
    await jsm.consumers.info(p.callStream(team), fn);
    return undefined;
  } catch (ie) {
    if (ie instanceof JetStreamApiError && (ie.code === CONSUMER_NOT_FOUND || ie.code === STREAM_NOT_FOUND)) return ie;
    return undefined;
  }
}

/** What a healer needs from its executor. */
export interface HealEnv {
  team: string;
  log: Logger;
  /** Looks up or creates the team's streams and fn's consumer, as start does. */
  provision(fn: string): Promise<void>;
  /** Withdraws fn's declaration and stops renewing it. */
  suspend(fn: string): Promise<void>;
  /** Declares fn again and renews it from then on. */
  resume(fn: string): Promise<void>;
}

/** Healer recreates one function's consumer when it is gone. */
export class Healer {
  private lastHealed = 0;
  private readonly again = new Backoff(1_000, 30_000);

  constructor(private readonly env: HealEnv, private readonly fn: string, private readonly stopped: AbortSignal) {}

  /**
   * heal recreates the consumer (and what it needs) until that works or
   * the worker stops, reporting whether it can serve again. While it
   * cannot, once a failure will not pass or it has not worked within
   * HEAL_WITHDRAW_AFTER_MS, the function's declaration is withdrawn,
   * saying why at error level; it is declared again once the consumer
   * exists.
   */
  async heal(cause: Error): Promise<boolean> {
    const { env, fn, stopped } = this;
    if (this.lastHealed && Date.now() - this.lastHealed < HEAL_AGAIN_MS) await sleep(this.again.next(), stopped);
    else this.again.reset();
    env.log.warn("the function's consumer is gone; recreating it", { team: env.team, fn, err: String(cause) });
    const began = Date.now();
    // The consumer is gone the moment a stream's deletion begins: let the
    // deletion finish first (see pkg/exec's healSettle).
    await sleep(jitter(HEAL_SETTLE_MS), stopped);
    const retry = new Backoff(250, 5_000);
    let withdrawn = false;
    while (!stopped.aborted) {
      try {
        await env.provision(fn);
      } catch (err) {
        if (stopped.aborted) break;
        if (!withdrawn && (!mayPass(err) || Date.now() - began >= HEAL_WITHDRAW_AFTER_MS)) {
          env.log.error("cannot recreate the function's consumer: not serving the function, and its declaration is withdrawn, " +
            "until the consumer exists again (if this process may not create streams or consumers, the control plane must recreate them)",
          { team: env.team, fn, err: String(err) });
          await env.suspend(fn);
          withdrawn = true;
        }
        await sleep(retry.next(), stopped);
        continue;
      }
      this.lastHealed = Date.now();
      if (withdrawn) await env.resume(fn);
      env.log.info("the function's consumer exists again; serving it", { team: env.team, fn, after_ms: Date.now() - began });
      return true;
    }
    return false;
  }
}
