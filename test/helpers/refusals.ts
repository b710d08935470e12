// One assertion for a client call the server refuses: its HTTP status, its
// error code and what its message says.
import assert from 'node:assert/strict';

/** Asserts that `p` rejects with `status`, the error code `code` and a message matching `message`. */
export async function assertRefused(p: Promise<unknown>, status: number, code: string, message: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    const err = e as { status?: number; code?: string; message: string };
    assert.equal(err.status, status, err.message);
    assert.equal(err.code, code, err.message);
    assert.match(err.message, message);
    return true;
  });
}
