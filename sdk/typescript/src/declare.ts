// Declarations as leases (docs/protocol.md, Declarations: leases): a declare
// request to the dispatchers on toolrelay.declare.<team>, sent again every
// lease renewal, withdrawn on stop. No answer is not a refusal: keep sending.

import type { NatsConnection } from "@nats-io/transport-node";
import { DeclarationRefusedError, type Refusal } from "./errors.js";
import * as p from "./protocol.js";

const REQUEST_TIMEOUT_MS = 2_000;
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

  private async send(op: "declare" | "withdraw", names = [...this.declarations.keys()]): Promise<Sent> {
    try {
      const m = await this.nc.request(p.declareSubject(this.team), this.body(op, names), { timeout: REQUEST_TIMEOUT_MS });
      return { reply: JSON.parse(m.string()) as Reply };
    } catch (e) {
      return { unanswered: e instanceof Error ? e.message : String(e) };
    }
  }

  /**
   * declare sends the declarations until a dispatcher stores them, or
   * returns at once when none answers (renewals reach the first that
   * starts). A refusal is thrown as a DeclarationRefusedError.
   */
  async declare(): Promise<void> {
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
      if ("unanswered" in sent) this.log("renewing the declarations: no answer", { err: sent.unanswered });
      else if (sent.reply.error) {
        this.log("renewing the declarations failed; sending again", { err: sent.reply.error });
        this.timer = setTimeout(tick, RETRY_AFTER_FAILURE_MS);
        return;
      } else if (sent.reply.refused?.length) this.log("declarations refused on renewal", { refused: sent.reply.refused });
      this.timer = setTimeout(tick, p.LEASE_RENEWAL_MS);
    };
    this.timer = setTimeout(tick, p.LEASE_RENEWAL_MS);
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
