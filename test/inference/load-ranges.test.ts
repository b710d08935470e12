// A stage loaded from a model file read by byte ranges (the orchestrator's
// spot checks, src/inference/load-ranges.ts) holds the weights a miner loads
// from the file on disk, whatever the chunk size, reads the whole file once
// and keeps only the stage, and refuses a file that does not hash to its id,
// one shorter than its size, and one with a non-finite value.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { inferenceFromFile } from '../../src/inference/load.ts';
import { inferenceFromRanges, type RangeSource } from '../../src/inference/load-ranges.ts';
import { importFolder } from '../../src/model/hf/convert.ts';
import { SafetensorsReader } from '../../src/model/hf/safetensors-file.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { TINY_LLAMA_CONFIG, writeRandomFolder } from '../helpers/hf-folder.ts';

const root = mkdtempSync(join(tmpdir(), 'nimble-load-ranges-'));
let engine: Engine;
let file: string;
let bytes: Uint8Array;
let sha256: string;
before(async () => {
  engine = await Engine.create({ threads: 1 });
  writeRandomFolder(join(root, 'folder'), TINY_LLAMA_CONFIG, { dtype: 'BF16', seed: 7 });
  file = join(root, 'model.safetensors');
  importFolder(join(root, 'folder'), file, { dtype: 'BF16' });
  bytes = new Uint8Array(readFileSync(file));
  sha256 = createHash('sha256').update(bytes).digest('hex');
});
after(() => {
  engine?.close();
  rmSync(root, { recursive: true, force: true });
});

/** The bytes as a range source, counting the bytes it is asked for. */
function source(b: Uint8Array, size = b.length): RangeSource & { served: number } {
  const s = {
    size,
    served: 0,
    read: async (start: number, end: number): Promise<Uint8Array> => {
      const out = b.subarray(start, Math.min(end, b.length));
      s.served += out.length;
      return out;
    },
  };
  return s;
}

test('each stage read by ranges holds the weights a miner reads from the file, for chunks that cut tensors anywhere; the file streams by once', async () => {
  const whole = await inferenceFromFile(engine, file);
  const config = whole.config;
  whole.release();
  for (const range of splitEvenly(config, 2)) {
    const want = await inferenceFromFile(engine, file, range);
    for (const chunkBytes of [4093, 65536, 16 << 20]) {
      const src = source(bytes);
      const got = await inferenceFromRanges(engine, src, { sha256, range, chunkBytes });
      assert.deepEqual(got.params.flat.data, want.params.flat.data, `stage [${range.from}, ${range.to}) in chunks of ${chunkBytes}`);
      // the header twice (to plan, then hashed with the rest), every other byte once
      assert.ok(src.served < bytes.length + 2 * 65536 && src.served >= bytes.length, `${src.served} bytes read of ${bytes.length}`);
      got.release();
    }
    want.release();
  }
});

test('a file that does not hash to its id, one shorter than its size, and one with a non-finite value are refused with the reason', async () => {
  const flipped = bytes.slice();
  flipped[flipped.length - 3] ^= 0x01;
  await assert.rejects(inferenceFromRanges(engine, source(flipped), { sha256, chunkBytes: 65536 }), /hash to [0-9a-f]{64}, not the [0-9a-f]{64} it is stored under: the stored file is corrupt/);
  await assert.rejects(inferenceFromRanges(engine, source(bytes.subarray(0, bytes.length - 100), bytes.length), { sha256 }), /end early: the file is shorter than its \d+ bytes/);
  await assert.rejects(inferenceFromRanges(engine, source(bytes.subarray(0, 4)), { sha256 }), /too short for a safetensors header/);
  // a NaN in the first tensor's first value (bf16 0x7fc0), the hash made to match: refused for the value, not the hash
  const reader = SafetensorsReader.open(file);
  const first = [...reader.entries.values()].sort((a, b) => a.start - b.start)[0];
  reader.close();
  const hl = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  const nan = bytes.slice();
  nan.set([0xc0, 0x7f], 8 + hl + first.start);
  const nanSha = createHash('sha256').update(nan).digest('hex');
  await assert.rejects(inferenceFromRanges(engine, source(nan), { sha256: nanSha }), new RegExp(`${first.name.replace(/\./g, '\\.')}: non-finite value at 0`));
});
