export { Executor, type Options } from "./executor.js";
export type { Approval, FunctionDef, Handler, Icon, Invocation, RetryPolicy } from "./function.js";
export {
  CallCancelledError, DeadlineError, DeclarationRefusedError, DidNotRunError, InvalidArgumentsError, RefusalError,
  RetryableError, ShutdownError, refuse, retryable, type Refusal,
} from "./errors.js";
export { schemaDigest, canonicalJSON } from "./digest.js";
export type { Logger } from "./worker.js";
export * as protocol from "./protocol.js";
