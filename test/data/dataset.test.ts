// Packing a job's local data (src/data/dataset.ts): a file whole, a folder's
// text files in the byte order of their relative paths with a blank line
// between them (dotfiles, binary files and other kinds skipped), links
// followed inside the folder and refused out of it, the size limits, and the
// corpus a local run trains on.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { HELDOUT_FRACTION, splitCorpus } from '../../src/data/corpus.ts';
import {
  checkCorpusSize,
  datasetCorpus,
  datasetHex,
  datasetId,
  isDatasetId,
  loadLocalCorpus,
  loadNamedCorpus,
  minCorpusBytes,
  packDataset,
} from '../../src/data/dataset.ts';
import { NimbleError } from '../../src/protocol/errors.ts';

const root = mkdtempSync(join(tmpdir(), 'nimble-dataset-'));
after(() => rmSync(root, { recursive: true, force: true }));

function folder(name: string, files: Record<string, string | Uint8Array>): string {
  const dir = join(root, name);
  for (const [rel, content] of Object.entries(files)) {
    mkdirSync(join(dir, rel, '..'), { recursive: true });
    writeFileSync(join(dir, rel), content);
  }
  mkdirSync(dir, { recursive: true });
  return dir;
}

const sha = (b: Uint8Array | string): string => createHash('sha256').update(b).digest('hex');
const text = (b: Uint8Array): string => new TextDecoder().decode(b);

test('a file is packed whole, whatever its bytes; its id is sha256: of them', () => {
  const bytes = new Uint8Array([104, 105, 0, 255, 10]);
  const file = join(root, 'one.bin');
  writeFileSync(file, bytes);
  const p = packDataset(file);
  assert.deepEqual(p.bytes, bytes);
  assert.equal(p.id, `sha256:${sha(bytes)}`);
  assert.deepEqual(p.files, ['one.bin']);
  assert.ok(isDatasetId(p.id));
  assert.equal(datasetHex(p.id), sha(bytes));
  assert.ok(!isDatasetId('sha256:ABC') && !isDatasetId(`sha256:${sha(bytes).toUpperCase()}`) && !isDatasetId(sha(bytes)));
});

test("a folder packs its text files in the byte order of their relative paths, a blank line between two, skipping dotfiles and binary files", () => {
  const dir = folder('corpus', {
    'b.txt': 'bee',
    'a/c.txt': 'sea\n',
    'a.txt': 'ay',
    'a/b/d.md': 'dee',
    'é.txt': 'accent',
    'Z.txt': 'zed',
    '.hidden': 'secret',
    '.git/config': 'secret too',
    'img.png': new Uint8Array([137, 80, 78, 71, 0, 1]),
    'latin1.txt': new Uint8Array([0x63, 0x61, 0x66, 0xe9]),
  });
  const p = packDataset(dir);
  // '.' (0x2e) sorts before '/' (0x2f), capitals before small letters, and é (0xc3 0xa9 in UTF-8) last
  assert.deepEqual(p.files, ['Z.txt', 'a.txt', 'a/b/d.md', 'a/c.txt', 'b.txt', 'é.txt']);
  assert.equal(text(p.bytes), 'zed\n\nay\n\ndee\n\nsea\n\n\nbee\n\naccent');
  assert.deepEqual(p.skipped.map((s) => s.path).sort(), ['img.png', 'latin1.txt']);
  assert.equal(p.id, `sha256:${sha(p.bytes)}`);

  // the same files written in another order elsewhere: the same bytes, the same id
  const again = folder('corpus-again', { 'é.txt': 'accent', 'b.txt': 'bee', 'a/b/d.md': 'dee', 'a/c.txt': 'sea\n', 'Z.txt': 'zed', 'a.txt': 'ay' });
  assert.equal(packDataset(again).id, p.id);
  // a folder of one text file packs to exactly that file
  const single = folder('single', { 'only.txt': 'just this\n' });
  assert.equal(packDataset(single).id, packDataset(join(single, 'only.txt')).id);
});

test('a link inside the folder is followed; one that leads out of it, or in a loop, is refused', () => {
  const dir = folder('linked', { 'real/x.txt': 'ex' });
  symlinkSync(join(dir, 'real', 'x.txt'), join(dir, 'alias.txt'));
  assert.equal(text(packDataset(dir).bytes), 'ex\n\nex');

  const outside = join(root, 'outside.txt');
  writeFileSync(outside, 'not yours');
  const leaky = folder('leaky', { 'a.txt': 'a' });
  symlinkSync(outside, join(leaky, 'b.txt'));
  assert.throws(() => packDataset(leaky), (e: unknown) => e instanceof NimbleError && /b\.txt .* leads out of it/.test(e.message));
  const up = folder('up', { 'a.txt': 'a' });
  symlinkSync('/etc', join(up, 'etc'));
  assert.throws(() => packDataset(up), /leads out of it/);

  const loop = folder('loop', { 'sub/a.txt': 'a' });
  symlinkSync(join(loop, 'sub'), join(loop, 'sub', 'again'));
  assert.throws(() => packDataset(loop), /link loop/);
});

test('limits: too large, nothing to pack, no such path; the smallest corpus holds a window in the training part and in the held-out tail', () => {
  const dir = folder('big', { 'a.txt': 'x'.repeat(600), 'b.txt': 'y'.repeat(600) });
  assert.throws(() => packDataset(dir, 1000), (e: unknown) => e instanceof NimbleError && e.status === 413 && /packs to 1202 bytes; the limit is 1000/.test(e.message));
  assert.throws(() => packDataset(join(dir, 'a.txt'), 100), /600 bytes; the limit is 100/);
  assert.throws(() => packDataset(folder('empty', {})), /has no text files/);
  assert.throws(() => packDataset(folder('binary-only', { 'x.bin': new Uint8Array([0, 1, 2]) })), /has no text files \(skipped: x\.bin\)/);
  assert.throws(() => packDataset(join(root, 'nope')), /no such file or folder/);

  for (const T of [1, 16, 64, 128, 1024]) {
    const min = minCorpusBytes(T);
    const ok = splitCorpus('t', new Uint8Array(min));
    assert.ok(ok.train.length >= T + 1 && ok.heldout.length >= T + 1, `context ${T}: ${min} bytes`);
    const short = splitCorpus('t', new Uint8Array(min - 1));
    assert.ok(short.train.length < T + 1 || short.heldout.length < T + 1, `context ${T}: ${min - 1} bytes would do`);
  }
  assert.ok(minCorpusBytes(64) >= (64 + 1) / HELDOUT_FRACTION - 10);
  checkCorpusSize(minCorpusBytes(16), 16, 'd');
  assert.throws(
    () => checkCorpusSize(100, 16, "the data 'tiny.txt'"),
    (e: unknown) => e instanceof NimbleError && e.code === 'too_small' && e.message === `the data 'tiny.txt' has 100 bytes; a model of context 16 needs at least ${minCorpusBytes(16)} (a window of 17 bytes in the training part and in the held-out last 10%)`,
  );
});

test('a local run takes a relative path from the spec file\'s folder and trains on the packed bytes; miners load names only, never a path', () => {
  const dir = folder('spec-dir', { 'data/a.txt': 'a'.repeat(200), 'data/b.txt': 'b'.repeat(200) });
  const c = loadLocalCorpus('data', dir, 16);
  const packed = packDataset(join(dir, 'data'));
  assert.equal(c.train.length + c.heldout.length, packed.bytes.length);
  assert.deepEqual(new Uint8Array([...c.train, ...c.heldout]), packed.bytes);
  assert.throws(() => loadLocalCorpus('data', dir, 64), /needs at least/);
  assert.throws(() => loadLocalCorpus(packed.id, dir, 16), /--local needs the local file/);
  assert.equal(loadLocalCorpus('moby-dick', dir, 16).name, 'moby-dick');

  assert.throws(() => loadNamedCorpus('/etc/passwd'), (e: unknown) => e instanceof NimbleError && /never a path/.test(e.message));
  assert.throws(() => loadNamedCorpus('data'), /never a path/);
  assert.throws(() => loadNamedCorpus(packed.id), /downloaded bytes/);
  // an uploaded dataset's corpus is checked against its id
  assert.equal(datasetCorpus(packed.id, packed.bytes).train.length, c.train.length);
  assert.throws(() => datasetCorpus(datasetId(new Uint8Array([1])), packed.bytes), /hash to/);
});
