// Cancellations (docs/protocol.md, Cancellations): the team's fncancel
// subjects, read by an ordered consumer from the cancel memory before start
// for as long as the executor runs. A cancelled turn's running calls are
// aborted and its queued calls are not started.

import { DeliverPolicy, type ConsumerMessages, type JetStreamClient } from "@nats-io/jetstream";
import { CallCancelledError } from "./errors.js";
import * as p from "./protocol.js";

const MAX_REASON = 200;

export class Cancels {
  private readonly turns = new Map<string, { at: number; reason: string }>();
  private readonly running = new Map<string, AbortController>();
  private messages?: ConsumerMessages;

  /** follow starts reading team's cancellations. */
  async follow(js: JetStreamClient, team: string): Promise<void> {
    const since = new Date(Date.now() - p.CANCEL_MEMORY_MS).toISOString();
    const c = await js.consumers.get(p.CANCEL_STREAM, {
      filter_subjects: [p.cancelFilter(team)], deliver_policy: DeliverPolicy.StartTime, opt_start_time: since,
    });
    this.messages = await c.consume({
      callback: (m) => {
        const turn = m.subject.split(".")[2];
        if (turn && /^[0-9a-f]{32}$/.test(turn)) this.cancel(turn, m.string());
      },
    });
  }

  stop(): void {
    void this.messages?.close();
  }

  /** cancelled returns why turn was cancelled, for the model, or undefined. */
  cancelled(turn: string): string | undefined {
    const c = this.turns.get(turn);
    return c ? c.reason || "the platform ended the run" : undefined;
  }

  cancel(turn: string, reason: string): void {
    let r = [...reason.trim()];
    const why = r.length > MAX_REASON ? r.slice(0, MAX_REASON).join("") + "…" : r.join("");
    const now = Date.now();
    this.turns.set(turn, { at: now, reason: why });
    for (const [t, c] of this.turns) if (now - c.at > p.CANCEL_MEMORY_MS) this.turns.delete(t);
    for (const [key, ac] of this.running) {
      if (p.turnOf(key) === turn) ac.abort(new CallCancelledError(this.cancelled(turn)!));
    }
  }

  /** track aborts ac when key's turn is (or was) cancelled, until untracked. */
  track(key: string, ac: AbortController): () => void {
    this.running.set(key, ac);
    const why = this.cancelled(p.turnOf(key));
    if (why !== undefined) ac.abort(new CallCancelledError(why));
    return () => this.running.delete(key);
  }
}
