// What an executor creates when missing (docs/protocol.md, Streams, Key-value
// buckets, Consuming calls): its team's call stream and one durable consumer
// per function, FNDLQ, FNCANCELS, the attempts bucket, and the team's results
// stream when the control plane shares the account. An existing stream that
// differs in what the contract rests on is refused, not changed; one that
// lacks per-message TTLs has them turned on.

import {
  AckPolicy, DeliverPolicy, DiscardPolicy, JetStreamApiError, RetentionPolicy, StorageType,
  type JetStreamManager, type StreamConfig,
} from "@nats-io/jetstream";
import * as p from "./protocol.js";

const ns = (ms: number) => ms * 1_000_000;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

type Spec = Partial<StreamConfig> & { name: string; subjects: string[] };

export function callStreamConfig(team: string, replicas: number): Spec {
  return {
    name: p.callStream(team), description: `toolrelay calls of team ${team}`, subjects: [`fncall.${team}.>`],
    retention: RetentionPolicy.Workqueue, discard: DiscardPolicy.New, max_age: ns(HOUR), duplicate_window: ns(2 * MINUTE),
    max_msg_size: 1 << 20, allow_msg_ttl: true, allow_direct: true, storage: StorageType.File, num_replicas: replicas,
  };
}

export function resultStreamConfig(team: string, replicas: number): Spec {
  return {
    name: p.resultStream(team), description: `toolrelay results of team ${team}, first result per call wins`,
    subjects: [`fnresult.${team}.>`], retention: RetentionPolicy.Limits, discard: DiscardPolicy.New,
    max_msgs_per_subject: 1, discard_new_per_subject: true, max_age: ns(2 * HOUR), max_bytes: 256 << 20,
    duplicate_window: ns(2 * MINUTE), max_msg_size: 1 << 20, allow_msg_ttl: true, allow_direct: true, storage: StorageType.File,
    num_replicas: replicas,
  };
}

export function deadLetterStreamConfig(replicas: number): Spec {
  return {
    name: p.DEAD_LETTER_STREAM, description: "toolrelay dead letters: calls that failed for good, and replays",
    subjects: ["fndlq.>"], retention: RetentionPolicy.Limits, discard: DiscardPolicy.Old, max_age: ns(336 * HOUR),
    duplicate_window: ns(15 * MINUTE), allow_direct: true, storage: StorageType.File, num_replicas: replicas,
  };
}

export function cancelStreamConfig(replicas: number): Spec {
  return {
    name: p.CANCEL_STREAM, description: "toolrelay turn cancellations", subjects: ["fncancel.>"],
    retention: RetentionPolicy.Limits, discard: DiscardPolicy.Old, max_age: ns(p.CANCEL_MEMORY_MS),
    duplicate_window: ns(MINUTE), storage: StorageType.File, num_replicas: replicas,
  };
}

/** ensureStream looks want up, creating it when missing; an incompatible one is an error. */
export async function ensureStream(jsm: JetStreamManager, want: Spec): Promise<void> {
  let have: StreamConfig;
  try {
    have = (await jsm.streams.info(want.name)).config;
  } catch (e) {
    if (!(e instanceof JetStreamApiError && e.code === 10059)) throw e;
    try {
      await jsm.streams.add(want);
      return;
    } catch (e2) {
      // Another process created it meanwhile: check it as found. If it
      // is not there, why it could not be created is the error (no
      // permission, say), not that it is missing.
      try {
        have = (await jsm.streams.info(want.name)).config;
      } catch {
        throw e2;
      }
    }
  }
  const diffs: string[] = [];
  const check = (k: keyof StreamConfig, ok: boolean) => {
    if (!ok) diffs.push(`${String(k)} is ${JSON.stringify(have[k])}, toolrelay needs ${JSON.stringify(want[k])}`);
  };
  check("retention", have.retention === want.retention);
  check("discard", have.discard === want.discard);
  check("max_msgs_per_subject", (have.max_msgs_per_subject ?? -1) === (want.max_msgs_per_subject ?? -1) ||
    (want.max_msgs_per_subject === undefined && (have.max_msgs_per_subject ?? 0) <= 0));
  check("discard_new_per_subject", !!have.discard_new_per_subject === !!want.discard_new_per_subject);
  if (want.allow_rollup_hdrs) check("allow_rollup_hdrs", !!have.allow_rollup_hdrs);
  if (want.allow_direct) check("allow_direct", !!have.allow_direct);
  for (const s of want.subjects) check("subjects", (have.subjects ?? []).includes(s));
  if (diffs.length) throw new Error(`toolrelay: stream ${want.name} is incompatible: ${diffs.join("; ")}`);
  if (want.allow_msg_ttl && !have.allow_msg_ttl) {
    // Created before toolrelay set per-message TTLs: the server turns them on
    // in place (never off), and what the stream holds stays.
    try {
      await jsm.streams.update(want.name, { ...have, allow_msg_ttl: true });
    } catch (e) {
      throw new Error(`toolrelay: allow per-message TTLs on stream ${want.name} (nats-server 2.11 or later, and the right to update it): ${e}`);
    }
  }
}

/**
 * attemptBucketConfig is the stream of the attempts bucket as docs/protocol.md
 * ("Side effects") gives it: what Go's key-value client creates for history 1
 * and TTL 2h. Created as a stream, not with @nats-io/kv, whose buckets lack
 * deny_delete.
 */
export function attemptBucketConfig(replicas: number): Spec {
  return {
    name: `KV_${p.ATTEMPT_BUCKET}`, description: "toolrelay attempts of side-effect functions",
    subjects: [`$KV.${p.ATTEMPT_BUCKET}.>`], retention: RetentionPolicy.Limits, discard: DiscardPolicy.New,
    max_msgs_per_subject: 1, max_age: ns(2 * HOUR), allow_rollup_hdrs: true, deny_delete: true, allow_direct: true,
    duplicate_window: ns(2 * MINUTE), storage: StorageType.File, num_replicas: replicas,
  };
}

/** ensureConsumer creates or updates a function's durable consumer. */
export async function ensureConsumer(jsm: JetStreamManager, team: string, fn: string, maxAckPending: number, ackWaitMs: number): Promise<void> {
  const cfg = {
    durable_name: fn, description: `toolrelay executor pool of ${fn}`, filter_subject: p.callSubject(team, fn),
    ack_policy: AckPolicy.Explicit, deliver_policy: DeliverPolicy.All, ack_wait: ns(ackWaitMs),
    max_deliver: -1, max_ack_pending: maxAckPending,
  };
  try {
    const have = (await jsm.consumers.info(p.callStream(team), fn)).config;
    if (have.ack_wait !== cfg.ack_wait || have.max_ack_pending !== cfg.max_ack_pending || have.filter_subject !== cfg.filter_subject) {
      await jsm.consumers.update(p.callStream(team), fn, {
        ack_wait: cfg.ack_wait, max_ack_pending: cfg.max_ack_pending, filter_subject: cfg.filter_subject, description: cfg.description,
      });
    }
  } catch (e) {
    if (!(e instanceof JetStreamApiError && e.code === 10014)) throw e;
    await jsm.consumers.add(p.callStream(team), cfg);
  }
}
