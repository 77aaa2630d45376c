// Errors a handler throws to say what became of a call, and the reasons a
// call's AbortSignal fires. The executor maps them to the protocol's
// outcomes in one place (worker.ts, outcomeOf).

/**
 * RetryableError marks a transient failure worth retrying (a backend
 * timeout, a 503). The call is naked with exponential backoff while
 * attempts remain and its deadline leaves room; then it fails with a dead
 * letter of reason attempts_exhausted. Throw `new RetryableError(msg)` or
 * `retryable(err)`.
 */
export class RetryableError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RetryableError";
  }
}

/**
 * RefusalError is an expected refusal: the function worked as designed and
 * declined (the order has shipped). The model reads the message as a
 * function_error; nothing is retried or dead-lettered.
 */
export class RefusalError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RefusalError";
  }
}

/**
 * InvalidArgumentsError: arguments the handler cannot use although they
 * passed the schema. The model gets invalid_arguments with the message.
 */
export class InvalidArgumentsError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "InvalidArgumentsError";
  }
}

/**
 * DidNotRunError is thrown by a reconcile hook that found the earlier
 * attempt had no effect: the handler then runs normally.
 */
export class DidNotRunError extends Error {
  constructor(message = "the earlier attempt had no effect") {
    super(message);
    this.name = "DidNotRunError";
  }
}

/** The reason of a call's signal when its turn was cancelled. */
export class CallCancelledError extends Error {
  constructor(readonly reason: string) {
    super(`the call's turn was cancelled: ${reason}`);
    this.name = "CallCancelledError";
  }
}

/** The reason of a call's signal when the executor shuts down: the call is handed back. */
export class ShutdownError extends Error {
  constructor() {
    super("executor shutting down");
    this.name = "ShutdownError";
  }
}

/** The reason of a call's signal at its deadline (or the function's timeout). */
export class DeadlineError extends Error {
  constructor(readonly deadline: Date) {
    super(`deadline ${deadline.toISOString()} reached`);
    this.name = "DeadlineError";
  }
}

/** Refusal is one declaration a dispatcher would not store. */
export interface Refusal {
  function: string;
  owner?: string;
  reason: string;
}

/**
 * DeclarationRefusedError: the dispatchers refused declarations, for
 * example because another team owns a name (`owner` set). The executor
 * does not serve a refused function.
 */
export class DeclarationRefusedError extends Error {
  constructor(readonly refusals: Refusal[]) {
    super(
      "toolrelay: declarations refused: " +
        refusals.map((r) => `${r.function}: ${r.reason}${r.owner ? ` (owned by team ${r.owner})` : ""}`).join("; "),
    );
    this.name = "DeclarationRefusedError";
  }
  /** ownedByOtherTeam reports whether a refusal is about a name another team owns. */
  get ownedByOtherTeam(): boolean {
    return this.refusals.some((r) => r.owner);
  }
}

/** retryable wraps err as a RetryableError (its message and cause kept). */
export function retryable(err: unknown): RetryableError {
  return new RetryableError(err instanceof Error ? err.message : String(err), { cause: err });
}

/** refuse returns a RefusalError with message, for `throw refuse("...")`. */
export function refuse(message: string): RefusalError {
  return new RefusalError(message);
}
