// Errors the orchestrator answers with a chosen HTTP status.

/** A request the coordinator refuses: status is the HTTP status to answer with. */
export class CoordinatorError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}
