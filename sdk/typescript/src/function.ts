// A function an executor serves, as registered, and what a handler sees.

import type { Context } from "@opentelemetry/api";
import type { Call } from "./protocol.js";

/** Invocation is one run of a function for one call. */
export interface Invocation {
  /** The call as the dispatcher published it. */
  readonly call: Call;
  /** The delivery number, from 1 (docs/protocol.md: the attempt number). */
  readonly attempt: number;
  /**
   * Aborted at the call's deadline (or the function's timeout, if sooner;
   * reason: DeadlineError), when the platform cancels the turn
   * (CallCancelledError), or when the executor gives up waiting at shutdown
   * (ShutdownError; the call is handed back). Pass it to fetch and friends.
   */
  readonly signal: AbortSignal;
  /** The call's deadline, or the function's timeout if sooner. */
  readonly deadline: Date;
  /** The replay number when an operator replayed the call from the dead letters. */
  readonly replay?: number;
  /** The OpenTelemetry context of the call's process span (parent: the call's traceparent). */
  readonly context: Context;
}

/**
 * Handler runs a function: it gets the call's arguments (validated against
 * the function's schema) and returns the output. A string is the output as
 * it is; anything else is encoded with JSON.stringify. Throw RetryableError,
 * RefusalError or InvalidArgumentsError to say what went wrong; any other
 * Error fails the call (function_error) with its message and a dead letter
 * (permanent_error), and a TypeError, ReferenceError, RangeError, SyntaxError
 * or a thrown non-Error counts as a crash of the handler (dead letter:
 * panic; the model is not shown its message).
 */
export type Handler<A = any, R = unknown> = (args: A, inv: Invocation) => R | Promise<R>;

/** RetryPolicy says how retryable errors are retried. */
export interface RetryPolicy {
  /** Runs of one call, the first included. Default: 3. */
  maxAttempts?: number;
  /** Delay before the second attempt, doubling each time, 20% jitter. Default: 200ms. */
  initialBackoffMs?: number;
  /** Cap of the delay. Default: 10s. */
  maxBackoffMs?: number;
}

export interface FunctionDef<A = any, R = unknown> {
  /** What the model calls: ^[a-zA-Z0-9_-]{1,64}$. */
  name: string;
  /** What the function does, for the model. */
  description?: string;
  /**
   * The JSON Schema of the arguments: an object, or its JSON text (sent
   * byte for byte). Default: {"type":"object","properties":{}}.
   */
  parameters?: object | string;
  /** Runs the function. */
  handler: Handler<A, R>;
  /** Bounds one run, in milliseconds. Default: the call's deadline only. */
  timeoutMs?: number;
  /** Calls this process runs at once. Default: 8. */
  concurrency?: number;
  /** Calls running at once across every process (the consumer's max ack pending). Default: 1000. */
  maxConcurrency?: number;
  /**
   * The function must never run twice for one call: an attempt mark is set
   * by compare-and-set before each run, and a delivery that finds an
   * earlier attempt marked running goes to reconcile (or fails as
   * unavailable with a may_have_run dead letter).
   */
  sideEffects?: boolean;
  /**
   * For a sideEffects function: called instead of handler when an earlier
   * attempt may have run. Return the output (having found the effect, say
   * by the call key), throw an error, or throw DidNotRunError to run the
   * handler normally.
   */
  reconcile?: Handler<A, R>;
  /** Overrides the executor's retry policy. */
  retry?: RetryPolicy;
  /** The team's version label of the implementation. */
  version?: string;
  /** Agents load the definition on demand (tool_search). Default: false. */
  deferLoading?: boolean;
  /** A short name MCP clients show instead of name (at most 256 bytes). */
  title?: string;
  /** Images MCP clients may show beside the tool (at most 4; see docs/protocol.md). */
  icons?: Icon[];
  /**
   * The JSON Schema of the output, an object: MCP clients get it as the
   * tool's outputSchema, and an output that does not match it reaches them
   * as an error.
   */
  outputSchema?: object;
  /**
   * Holds calls for a person's decision before any executor sees them:
   * "required", or { when: a CEL condition over args such as
   * "args.amount > 100", approvers: ["admin", "team", or token names] }.
   * The dispatcher compiles the condition when the function is declared
   * and refuses the declaration, by name, if it does not compile.
   */
  approval?: "required" | Approval;
}

/** A function's approval policy (docs/approvals.md). */
export interface Approval {
  required?: boolean;
  /** A CEL expression of type bool over args, the call's arguments. */
  when?: string;
  /** Who may decide: "admin", "team" (the owning team) or token names. Default: admin and team. */
  approvers?: string[];
}

/** An image of a tool: an https: URL, or a data:image/ URL of at most 16 KiB. */
export interface Icon {
  src: string;
  mimeType?: string;
  /** "48x48", "any". */
  sizes?: string[];
  theme?: "light" | "dark";
}
