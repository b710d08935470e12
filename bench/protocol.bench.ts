// Protocol benches: codec, frame and signing throughput on one thread.
// Tensors are 4 MB of float32 (2^20 values); MB/s counts float32 input bytes
// (10^6 bytes per MB). Each figure is the median of several timed repetitions.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { median, type Bench, type BenchOptions, type BenchResult } from './harness.ts';
import { decodeF16, encodeF16 } from '../src/protocol/fp16.ts';
import { dequantizeInt8, groupCount, quantizeInt8 } from '../src/protocol/int8.ts';
import { ErrorFeedback } from '../src/protocol/error-feedback.ts';
import { decodeFrame, encodeFrame, sha256Hex } from '../src/protocol/frame.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { RequestSigner, RequestVerifier, type AuthHeaders } from '../src/protocol/signing.ts';
import { FsBlobStore } from '../src/orchestrator/blobs/blobs.ts';

const N = 1 << 20;
const MB = (N * 4) / 1e6;
const REPS = 9;
const BLOCK = 256;

/** Median MB/s of `fn` over REPS runs after one warm-up. */
function throughput(fn: () => void): number {
  fn();
  const rates: number[] = [];
  for (let r = 0; r < REPS; r++) {
    const t = performance.now();
    fn();
    rates.push(MB / ((performance.now() - t) / 1000));
  }
  return median(rates);
}

function tensor(): Float32Array {
  const x = new Float32Array(N);
  let s = 1;
  for (let i = 0; i < N; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    x[i] = (s / 2 ** 32 - 0.5) * 8;
  }
  return x;
}

async function codecs(options: BenchOptions): Promise<BenchResult[]> {
  const x = tensor();
  const halves = new Uint16Array(N);
  const back = new Float32Array(N);
  const rowScales = new Float32Array(N / 1024);
  const blockScales = new Float32Array(groupCount(N, BLOCK));
  const codes = new Int8Array(N);
  const ef = new ErrorFeedback(N, BLOCK);
  const efOut = { scales: new Float32Array(groupCount(N, BLOCK)), codes: new Int8Array(N) };
  const out: BenchResult[] = [];
  const add = (bench: string, value: number): void => {
    out.push({ bench: `protocol.${bench}.mb_per_s`, value: Math.round(value), unit: 'MB/s' });
    options.log(`${bench}: ${value.toFixed(0)} MB/s`);
  };
  add('fp16_encode', throughput(() => encodeF16(x, halves)));
  add('fp16_decode', throughput(() => decodeF16(halves, back)));
  add('int8_row_encode', throughput(() => quantizeInt8(x, 1024, rowScales, codes)));
  add('int8_block_encode', throughput(() => quantizeInt8(x, BLOCK, blockScales, codes)));
  add('int8_block_ef_encode', throughput(() => ef.compress(x, efOut)));
  add('int8_block_decode', throughput(() => dequantizeInt8(blockScales, codes, BLOCK, back)));
  add('sha256', throughput(() => sha256Hex(new Uint8Array(x.buffer))));
  const shape = [N / 1024, 1024];
  const frames = {
    f32: encodeFrame(x, shape, 'f32'),
    f16: encodeFrame(x, shape, 'f16'),
    'int8-block': encodeFrame(x, shape, 'int8-block'),
  };
  add('frame_encode_f32', throughput(() => encodeFrame(x, shape, 'f32', { run: 'bench', stage: 0 })));
  add('frame_encode_f16', throughput(() => encodeFrame(x, shape, 'f16', { run: 'bench', stage: 0 })));
  add('frame_encode_int8_block', throughput(() => encodeFrame(x, shape, 'int8-block', { run: 'bench', stage: 0 })));
  add('frame_decode', throughput(() => decodeFrame(frames.f32)));
  add('frame_decode_f16', throughput(() => decodeFrame(frames.f16)));
  add('frame_decode_int8_block', throughput(() => decodeFrame(frames['int8-block'])));
  return out;
}

/** Signed requests per second, signed and verified, with the wallet key (joining) and with a session key (everything else). */
async function signing(options: BenchOptions): Promise<BenchResult[]> {
  const wallet = new RequestSigner('0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80');
  const session = SessionKey.generate();
  const sessionSigner = new RequestSigner({ session, address: wallet.address });
  const verifier = new RequestVerifier({ maxNonces: 1_000_000, maxNoncesPerSender: 1_000_000, sessionKeyOf: () => session.publicKey });
  const body = new Uint8Array(4096).fill(7);
  const rates = async (signer: RequestSigner, count: number): Promise<{ sign: number; verify: number }> => {
    const signRates: number[] = [];
    const verifyRates: number[] = [];
    for (let r = 0; r < 3; r++) {
      const headers: AuthHeaders[] = [];
      let t = performance.now();
      for (let i = 0; i < count; i++) headers.push(await signer.sign('POST', '/v1/work', body));
      signRates.push(count / ((performance.now() - t) / 1000));
      t = performance.now();
      for (const h of headers) await verifier.verify({ method: 'POST', path: '/v1/work', headers: h, body });
      verifyRates.push(count / ((performance.now() - t) / 1000));
    }
    return { sign: Math.round(median(signRates)), verify: Math.round(median(verifyRates)) };
  };
  const w = await rates(wallet, 300);
  const s = await rates(sessionSigner, 3000);
  options.log(`wallet (secp256k1): sign ${w.sign}/s, verify ${w.verify}/s; session (ed25519): sign ${s.sign}/s, verify ${s.verify}/s (4 KB body)`);
  return [
    { bench: 'protocol.sign.per_s', value: w.sign, unit: 'req/s' },
    { bench: 'protocol.verify.per_s', value: w.verify, unit: 'req/s' },
    { bench: 'protocol.session_sign.per_s', value: s.sign, unit: 'req/s' },
    { bench: 'protocol.session_verify.per_s', value: s.verify, unit: 'req/s' },
  ];
}

async function blobs(options: BenchOptions): Promise<BenchResult[]> {
  const dir = await mkdtemp(join(tmpdir(), 'nimble-bench-blobs-'));
  try {
    const store = await FsBlobStore.open(dir);
    const bytes = new Uint8Array(tensor().buffer);
    const put: number[] = [];
    const get: number[] = [];
    for (let r = 0; r < 5; r++) {
      bytes[0] = r; // new content each time, so put really writes
      let t = performance.now();
      const id = await store.put(bytes);
      put.push(MB / ((performance.now() - t) / 1000));
      t = performance.now();
      await store.get(id);
      get.push(MB / ((performance.now() - t) / 1000));
    }
    options.log(`blob put ${median(put).toFixed(0)} MB/s (fsync), get ${median(get).toFixed(0)} MB/s (hash-checked)`);
    return [
      { bench: 'protocol.blob_put.mb_per_s', value: Math.round(median(put)), unit: 'MB/s' },
      { bench: 'protocol.blob_get.mb_per_s', value: Math.round(median(get)), unit: 'MB/s' },
    ];
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export const protocolBenches: Bench[] = [
  { group: 'protocol', run: codecs },
  { group: 'protocol', run: signing },
  { group: 'protocol', run: blobs },
];
