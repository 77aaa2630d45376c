// W3C trace context in NATS headers, which are case-sensitive: always the
// lower-case "traceparent" and "tracestate". The API package ships no
// propagator, so the header is read and written here; with no OpenTelemetry
// SDK installed the span is non-recording and carries the caller's own
// context, so the result forwards the call's traceparent as it came and
// the turn keeps one trace.

import { context, createTraceState, isSpanContextValid, trace, type Context, type SpanContext } from "@opentelemetry/api";
import type { MsgHdrs } from "@nats-io/transport-node";

const traceparentRE = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** extract returns parent with the remote span context of headers, if any. */
export function extract(headers: MsgHdrs | undefined, parent: Context = context.active()): Context {
  const tp = headers?.get("traceparent");
  const m = tp ? traceparentRE.exec(tp.trim()) : null;
  if (!m || m[1] === "ff") return parent;
  const sc: SpanContext = { traceId: m[2]!, spanId: m[3]!, traceFlags: parseInt(m[4]!, 16) & 1, isRemote: true };
  if (!isSpanContextValid(sc)) return parent;
  const ts = headers?.get("tracestate");
  if (ts) sc.traceState = createTraceState(ts);
  return trace.setSpanContext(parent, sc);
}

/** inject writes ctx's span context into headers. */
export function inject(ctx: Context, headers: MsgHdrs): void {
  const sc = trace.getSpanContext(ctx);
  if (!sc || !isSpanContextValid(sc)) return;
  headers.set("traceparent", `00-${sc.traceId}-${sc.spanId}-0${(sc.traceFlags & 1).toString(16)}`);
  const ts = sc.traceState?.serialize();
  if (ts) headers.set("tracestate", ts);
}
