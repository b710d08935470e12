// The rules of a large model file's upload in chunks
// (src/orchestrator/models/model-uploads.ts): chunks only at the upload's
// offset, its opener's alone, the declared sha256 or nothing, one open upload
// per owner and two in all, and no slot held for ever: an idle upload, or a
// trickle past its deadline, is dropped with its file.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { IDLE_MS, MAX_UPLOADS, MIN_BYTES_PER_S, ModelUploads } from '../../../src/orchestrator/models/model-uploads.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

const root = mkdtempSync(join(tmpdir(), 'nimble-uploads-'));
after(() => rmSync(root, { recursive: true, force: true }));
const alice = '0x' + 'a1'.repeat(20), mallory = '0x' + 'b2'.repeat(20);
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');
const refused = (fn: () => unknown, status: number, message: RegExp): void =>
  assert.throws(fn, (e: unknown) => e instanceof NimbleError && e.status === status && message.test(e.message));

test('chunks come at the offset, from the opener only; the whole file hashes to its declaration or nothing is used', async () => {
  const uploads = new ModelUploads(join(root, 'a'));
  const data = new Uint8Array(1000).map((_, i) => i % 251);
  const u = uploads.create(alice, data.length, sha(data));
  refused(() => uploads.append(mallory, u.id, 0, data.subarray(0, 10)), 404, /no open upload/);
  refused(() => uploads.append(alice, u.id, 10, data.subarray(0, 10)), 409, /at byte 0, not 10/);
  assert.equal(uploads.append(alice, u.id, 0, data.subarray(0, 600)).received, 600);
  refused(() => uploads.append(alice, u.id, 600, new Uint8Array(500)), 400, /declared 1000 bytes/);
  await assert.rejects(uploads.finish(alice, u.id, async () => 'early'), (e: unknown) => e instanceof NimbleError && e.status === 409);
  uploads.append(alice, u.id, 600, data.subarray(600));
  assert.equal(await uploads.finish(alice, u.id, async (done) => readFileSync(done.path).equals(Buffer.from(data))), true);
  assert.deepEqual(readdirSync(join(root, 'a')), [], 'the file is gone once used');

  const liar = uploads.create(alice, 4, 'ab'.repeat(32));
  uploads.append(alice, liar.id, 0, new Uint8Array(4));
  let used = false;
  await assert.rejects(uploads.finish(alice, liar.id, async () => (used = true)), /not the declared/);
  assert.equal(used, false);
  assert.ok(!existsSync(liar.path));
});

test('one open upload per owner and two in all; idle ones and trickles past their deadline are dropped, and pending bytes count', () => {
  let now = 0;
  const uploads = new ModelUploads(join(root, 'b'), () => now);
  const first = uploads.create(alice, 100 << 20, 'aa'.repeat(32));
  refused(() => uploads.create(alice, 10, 'bb'.repeat(32)), 429, /has an upload open already/);
  uploads.create(mallory, 10, 'cc'.repeat(32));
  assert.equal(MAX_UPLOADS, 2);
  refused(() => uploads.create('0x' + 'c3'.repeat(20), 10, 'dd'.repeat(32)), 429, /uploads are under way/);
  assert.equal(uploads.pendingBytes(), (100 << 20) + 10, 'what the budget admits a new upload beside');
  // mallory goes idle: dropped
  now += IDLE_MS - 1000;
  uploads.append(alice, first.id, 0, new Uint8Array(1));
  now += 2000;
  assert.equal(uploads.pendingBytes(), 100 << 20);
  // alice trickles a byte a minute: never idle, but dropped at her deadline
  const deadline = IDLE_MS + Math.ceil(((100 << 20) / MIN_BYTES_PER_S) * 1000);
  for (let at = 1; now < deadline - 60_000; at++) {
    now += 60_000;
    uploads.append(alice, first.id, at, new Uint8Array(1));
  }
  now = deadline + 1;
  refused(() => uploads.get(alice, first.id), 404, /no open upload/);
  assert.equal(uploads.pendingBytes(), 0);
  assert.deepEqual(readdirSync(join(root, 'b')), [], 'dropped uploads leave no file');
});

test('absurd declarations are refused before a file is made', () => {
  const uploads = new ModelUploads(join(root, 'c'));
  refused(() => uploads.create(alice, 0, 'aa'.repeat(32)), 400, /an upload is 1 to/);
  refused(() => uploads.create(alice, 2 ** 53, 'aa'.repeat(32)), 400, /an upload is 1 to/);
  refused(() => uploads.create(alice, 10, 'not-hex'), 400, /sha256/);
  assert.deepEqual(readdirSync(join(root, 'c')), []);
});
