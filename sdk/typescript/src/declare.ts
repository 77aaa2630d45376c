// Declarations as leases (docs/protocol.md, Declarations: leases): a declare
// request to the dispatchers on toolrelay.declare.<team>, sent again every
// lease renewal, withdrawn on stop. No answer is not a refusal: keep sending.
// A function whose consumer is gone for good is held back (suspend): its
// declaration is withdrawn alone and left out of renewals until resume.

import type { NatsConnection } from "@nats-io/transport-node";
import { DeclarationRefusedError, type Refusal } from "./errors.js";
import * as p from "./protocol.js";

const RETRY_AFTER_FAILURE_MS = 500;

export interface Reply {
  v: number;
  accepted?: string[];
  refused?: Refusal[];
  error?: string;
}

/** Outcome of one exchange: answered, or why not (to be sent again). */
type Sent = { reply: Reply } | { unanswered: string };

export class Lease {
  private timer?: NodeJS.Timeout;
  private stopped = false;
  /** Functions held back: not declared now (their consumer is gone). */
  private readonly held = new Set<string>();
  /** Whether declare has begun: only then is there anything to withdraw. */
  private declaring = false;
  /** Whether renewals fail now: their failure is logged once, not every retry. */
  private failing = false;
  /** The last exchange: one at a time, so a renewal never overtakes a withdrawal. */
  private last: Promise<unknown> = Promise.resolve();
  /** declarations: the JSON text of each declaration, by function. */
  constructor(
    private readonly nc: NatsConnection,
    private readonly team: string,
    private readonly declarations: Map<string, string>,
    private readonly log: (msg: string, extra?: object) => void,
  ) {}

  private body(op: "declare" | "withdraw", names: string[]): string {
    // Declarations are embedded as text so their parameters reach the
    // dispatcher byte for byte as the digest was computed over them.
    return `{"v":${p.VERSION},"op":"${op}","declarations":[${names.map((n) => this.declarations.get(n)!).join(",")}]}`;
  }

  /** serving names the functions declared now: those not held back. */
  private serving(): string[] {
    return [...this.declarations.keys()].filter((n) => !this.held.has(n));
  }

  /**
   * batches splits names into as few requests as the protocol's bounds
   * allow: MAX_DECLARATIONS declarations and MAX_ENVELOPE_SIZE bytes each.
   */
  private batches(names: string[]): string[][] {
    const overhead = 256; // the request's own fields, generously
    const out: string[][] = [];
    let batch: string[] = [];
    let size = overhead;
    for (const n of names) {
      const len = Buffer.byteLength(this.declarations.get(n)!) + 1;
      if (batch.length === p.MAX_DECLARATIONS || (batch.length > 0 && size + len > p.MAX_ENVELOPE_SIZE)) {
        out.push(batch);
        batch = [];
        size = overhead;
      }
      batch.push(n);
      size += len;
    }
    if (batch.length > 0) out.push(batch);
    return out;
  }

  /**
   * send sends the requests of op after the exchange before has ended, one
   * per batch, and joins their replies; declaring nothing is answered at
   * once. A batch no dispatcher answers does not keep the next from being
   * sent (each declaration lapses on its own); the exchange is then
   * unanswered as a whole, and sent again.
   */
  private send(op: "declare" | "withdraw", names?: string[]): Promise<Sent> {
    const sent = this.last.then(async (): Promise<Sent> => {
      const which = names ?? (op === "declare" ? this.serving() : [...this.declarations.keys()]);
      const joined: Reply = { v: p.VERSION };
      let unanswered: string | undefined;
      for (const batch of this.batches(which)) {
        let reply: Reply;
        try {
          const m = await this.nc.request(p.declareSubject(this.team), this.body(op, batch), { timeout: p.DECLARE_WAIT_MS });
          reply = JSON.parse(m.string()) as Reply;
        } catch (e) {
          unanswered ??= e instanceof Error ? e.message : String(e);
          continue;
        }
        if (reply.accepted?.length) joined.accepted = [...(joined.accepted ?? []), ...reply.accepted];
        if (reply.refused?.length) joined.refused = [...(joined.refused ?? []), ...reply.refused];
        joined.error ??= reply.error || undefined;
      }
      return unanswered === undefined ? { reply: joined } : { unanswered };
    });
    this.last = sent;
    return sent;
  }

  /**
   * declare sends the declarations until a dispatcher stores them, or
   * returns at once when none answers (renewals reach the first that
   * starts). A refusal is thrown as a DeclarationRefusedError.
   */
  async declare(): Promise<void> {
    this.declaring = true;
    for (let tries = 0; ; tries++) {
      const sent = await this.send("declare");
      if ("unanswered" in sent) {
        this.log("no dispatcher answered the declarations; declaring again every renewal", { err: sent.unanswered });
        return;
      }
      const { reply } = sent;
      if (reply.refused?.length) throw new DeclarationRefusedError(reply.refused);
      if (!reply.error) return;
      if (tries >= 10) {
        this.log("dispatchers could not store the declarations; declaring again every renewal", { err: reply.error });
        return;
      }
      await new Promise((r) => setTimeout(r, RETRY_AFTER_FAILURE_MS));
    }
  }

  /** renew keeps renewing every lease renewal period until withdraw. */
  renew(): void {
    const tick = async () => {
      if (this.stopped) return;
      const sent = await this.send("declare");
      if (this.stopped) return;
      const failed = "unanswered" in sent ? sent.unanswered : sent.reply.error || undefined;
      if (failed !== undefined) {
        // Sent again soon, not a renewal period later: the lease lapses
        // LEASE_TTL_MS after the last renewal that was stored. Logged
        // once per outage.
        if (!this.failing) this.log("renewing the declarations failed; sending again until a dispatcher stores them", { err: failed });
        this.failing = true;
        this.timer = setTimeout(tick, RETRY_AFTER_FAILURE_MS);
        return;
      }
      if (this.failing) this.log("a dispatcher has the declarations again");
      this.failing = false;
      if ("reply" in sent && sent.reply.refused?.length) this.log("declarations refused on renewal", { refused: sent.reply.refused });
      this.timer = setTimeout(tick, p.LEASE_RENEWAL_MS);
    };
    this.timer = setTimeout(tick, p.LEASE_RENEWAL_MS);
  }

  /**
   * suspend withdraws fn's declaration alone and leaves it out of renewals
   * until resume: this process cannot serve fn now. A withdrawal no
   * dispatcher answers lapses with the lease.
   */
  async suspend(fn: string): Promise<void> {
    if (this.held.has(fn)) return;
    this.held.add(fn);
    if (!this.declaring || this.stopped) return;
    const sent = await this.send("withdraw", [fn]);
    if ("unanswered" in sent || sent.reply.error) {
      this.log("withdrawing the function's declaration failed; it lapses with its lease",
        { fn, err: "unanswered" in sent ? sent.unanswered : sent.reply.error });
    }
  }

  /** resume declares fn again at once (with the others served) and renews it from then on. */
  async resume(fn: string): Promise<void> {
    if (!this.held.delete(fn) || !this.declaring || this.stopped) return;
    const sent = await this.send("declare");
    if ("unanswered" in sent || sent.reply.error || sent.reply.refused?.length) {
      this.log("declaring the function again failed; the next renewal declares it",
        { fn, err: "unanswered" in sent ? sent.unanswered : sent.reply.error, refused: "reply" in sent ? sent.reply.refused : undefined });
    }
  }

  /** withdraw stops renewing and withdraws every declaration. */
  async withdraw(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    const sent = await this.send("withdraw");
    if ("unanswered" in sent || sent.reply.error) {
      this.log("withdrawing the declarations failed; they lapse with their leases", {});
    }
  }
}
