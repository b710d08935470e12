// Absurd values are refused where they enter: finite numbers no real miner,
// developer or file has (1e30, 2^53, 2^53 − 1) get a 400-class error naming
// the field, in the messages' schemas, the check bundle's meta, tensor
// frames, safetensors files and checkpoints' metadata; the largest sensible
// values pass.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { TSchema } from '@sinclair/typebox';
import { CreateRunRequest } from '../../src/api/schemas.ts';
import { checkpointInfo, CHECKPOINT_FORMAT } from '../../src/model/checkpoint.ts';
import { GPT_CONFIGS } from '../../src/model/config.ts';
import { decodeSafetensors, encodeSafetensors } from '../../src/model/safetensors.ts';
import { decodeCheckBundle, encodeCheckBundle, type CheckMeta } from '../../src/protocol/check-bundle.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { decodeFrame, encodeFrame } from '../../src/protocol/frame.ts';
import { BackwardMeta, ForwardMeta, HeartbeatRequest, JoinRequest, parse, WorkReport } from '../../src/protocol/messages.ts';

const ABSURD = [1e30, 2 ** 53, 2 ** 53 - 1];

/** `value` with `path` (dot-separated) set to `v`. */
function withField(value: unknown, path: string, v: unknown): unknown {
  const copy = structuredClone(value) as Record<string, unknown>;
  const keys = path.split('.');
  let at = copy;
  for (const k of keys.slice(0, -1)) at = at[k] as Record<string, unknown>;
  at[keys[keys.length - 1]] = v;
  return copy;
}

/** Each of `values` at `path` is refused with 400 naming the field; `ok` (if given) is accepted there. */
function refuses(schema: TSchema, base: unknown, path: string, values: unknown[], ok?: unknown): void {
  parse(schema, base, 'base');
  for (const v of values) {
    assert.throws(
      () => parse(schema, withField(base, path, v), 'message'),
      (err: unknown) => err instanceof NimbleError && err.status === 400 && err.message.includes(`/${path.replaceAll('.', '/')}`),
      `${path} = ${String(v)} is refused, naming the field`,
    );
  }
  if (ok !== undefined) parse(schema, withField(base, path, ok), 'message');
}

const join = { name: 'm1', url: 'http://127.0.0.1:9999', hardware: { gflops: 10, threads: 2, memoryBytes: 1 << 30 }, bandwidthMbps: 100, sessionKey: 'A'.repeat(43) };

test('a join with absurd hardware figures is refused: memory past 1 PiB, GFLOP/s past 1e7, threads past 1024, bandwidth past 1 Tbit/s, a GPU adapter name past 200 characters or with control characters, an unknown backend; the largest sensible ones pass', () => {
  refuses(JoinRequest, join, 'hardware.memoryBytes', [...ABSURD, 2 ** 50 + 1], 2 ** 50);
  refuses(JoinRequest, join, 'hardware.gflops', [...ABSURD, 0], 1e7);
  refuses(JoinRequest, join, 'hardware.threads', [...ABSURD, 1025, 2.5], 1024);
  refuses(JoinRequest, join, 'bandwidthMbps', [...ABSURD, 1e6 + 1, -1], 1e6);
  refuses(JoinRequest, join, 'name', ['bad\nname', 'x'.repeat(65), ''], 'miner 7 (rack β)');
  refuses(JoinRequest, join, 'hardware.adapter', ['x'.repeat(201), 'SwiftShader\ndriver', '', 'GPU\u0000'], 'x'.repeat(200));
  refuses(JoinRequest, join, 'hardware.backend', ['cuda', ''], 'webgpu');
});

test('heartbeats, work reports and frame meta refuse absurd slots, queues and stages', () => {
  const report = { runId: 'run-1', microbatch: 1, attempt: 1, stage: 0, phase: 'forward', bytesSent: 0 };
  refuses(HeartbeatRequest, { freeSlots: 0, queue: 0, reports: [] }, 'freeSlots', [...ABSURD, 4097], 4096);
  refuses(HeartbeatRequest, { freeSlots: 0, queue: 0, reports: [] }, 'queue', ABSURD, 65_536);
  refuses(HeartbeatRequest, { freeSlots: 0, queue: 0, reports: [] }, 'stage', [...ABSURD, 1024], 1023);
  refuses(WorkReport, report, 'stage', [...ABSURD, 1024], 1023);
  refuses(WorkReport, report, 'microbatch', ABSURD, 2 ** 31 - 1);
  refuses(WorkReport, report, 'bytesSent', ABSURD);
  refuses(WorkReport, { ...report, loss: 1 }, 'loss', [...ABSURD, 101]);
  refuses(ForwardMeta, { runId: 'run-1', microbatch: 1, attempt: 1, shard: 0, step: 0, stage: 1, ticket: 'A'.repeat(86) }, 'stage', ABSURD);
  refuses(BackwardMeta, { runId: 'run-1', microbatch: 1, attempt: 1, stage: 0 }, 'attempt', ABSURD);
});

test('a run request with absurd steps, batch, learning rates or names is refused', () => {
  const run = { model: 'gpt-micro', data: 'moby-dick', steps: 10 };
  refuses(CreateRunRequest, run, 'steps', [...ABSURD, 10_000_001], 10_000_000);
  refuses(CreateRunRequest, run, 'batchSize', [...ABSURD, 4097], 4096);
  refuses(CreateRunRequest, run, 'mergeEvery', ABSURD, 1_000_000);
  refuses(CreateRunRequest, run, 'seed', ABSURD, 2 ** 31 - 1);
  refuses(CreateRunRequest, run, 'stages', ABSURD, 1024);
  refuses(CreateRunRequest, run, 'minMiners', ABSURD, 100_000);
  refuses(CreateRunRequest, run, 'lr', [...ABSURD, 1e-30, 0, 2], 1e-8);
  refuses(CreateRunRequest, run, 'outerLr', [...ABSURD, 1e-30, 11], 10);
  refuses(CreateRunRequest, run, 'model', ['../gpt', 'gpt micro', 'x'.repeat(161), 'mlp:4096-64-2\n']);
  refuses(CreateRunRequest, run, 'data', ['moby\u0000dick']);
});

test("a check bundle whose meta names an absurd microbatch, stage, round, sample count or shard is refused (it was accepted: integers without a maximum)", () => {
  const weights = new Float32Array(8);
  const meta: CheckMeta = { runId: 'run-1', microbatch: 3, stage: 0, round: 1, samples: 2, shard: 5 };
  const expect = { paramCount: 8, activationShape: [2, 2], hasInput: false, hasOutput: false, maxBytes: 1 << 20 };
  const output = null;
  assert.deepEqual(decodeCheckBundle(encodeCheckBundle({ meta, weights, input: null, output }), expect).meta, meta);
  for (const key of ['microbatch', 'stage', 'round', 'samples', 'shard'] as const) {
    for (const v of ABSURD) {
      const bytes = encodeCheckBundle({ meta: { ...meta, [key]: v }, weights, input: null, output });
      assert.throws(
        () => decodeCheckBundle(bytes, expect),
        (err: unknown) => err instanceof NimbleError && err.status === 400 && err.message.includes(`/${key}`),
        `${key} = ${v}`,
      );
    }
  }
});

test('a frame whose shape has an absurd dimension is refused even when another dimension makes it empty', () => {
  const empty = new Float32Array(0);
  for (const d of [2 ** 40, 2 ** 53 - 1]) {
    const frame = encodeFrame(empty, [d, 0], 'f32');
    assert.throws(() => decodeFrame(frame), (err: unknown) => err instanceof NimbleError && err.status === 413 && /dimension/.test(err.message), `[${d}, 0]`);
  }
  assert.equal(decodeFrame(encodeFrame(empty, [1 << 26, 0], 'f32')).data.length, 0, 'a dimension at the element limit passes');
});

test('safetensors files with absurd shapes, and checkpoints with absurd steps, parts or model sizes, are refused', () => {
  const header = (shape: number[]): Uint8Array => {
    const json = new TextEncoder().encode(JSON.stringify({ t: { dtype: 'F32', shape, data_offsets: [0, 0] } }));
    const out = new Uint8Array(8 + json.length);
    new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
    out.set(json, 8);
    return out;
  };
  assert.equal(decodeSafetensors(header([0, 4])).tensors.get('t')!.data.length, 0);
  for (const shape of [[2 ** 40, 0], [2 ** 53 - 1, 0], Array(9).fill(0)]) assert.throws(() => decodeSafetensors(header(shape)), /bad shape/, `[${shape}]`);

  const tiny = GPT_CONFIGS['gpt-micro'];
  const checkpoint = (meta: Record<string, string>): Uint8Array =>
    encodeSafetensors([], { format: CHECKPOINT_FORMAT, config: JSON.stringify(tiny), from: '0', to: '1', step: '5', ...meta });
  assert.equal(checkpointInfo(decodeSafetensors(checkpoint({}))).step, 5);
  for (const step of ['9007199254740991', '2147483648', '1e30']) assert.throws(() => checkpointInfo(decodeSafetensors(checkpoint({ step }))), /'step'/, step);
  for (const over of [{ vocabSize: 1e30 }, { vocabSize: 2 ** 52 }, { layers: 2 ** 53 - 1 }, { channels: 1 << 15, layers: 1024 }]) {
    assert.throws(() => checkpointInfo(decodeSafetensors(checkpoint({ config: JSON.stringify({ ...tiny, ...over }) }))), /config is invalid/, JSON.stringify(over));
  }
});

test('a deployment assignment carries an imported model of gigabytes and its full inline reference', async () => {
  const { DeploymentAssignment } = await import('../../src/protocol/messages.ts');
  const { Value } = await import('@sinclair/typebox/value');
  const a = {
    deploymentId: 'dep-1', sha256: 'ab'.repeat(32), bytes: 2_200_000_000,
    model: 'llama:v128256.t131072.c4096.l32.h32.k8.d128.i14336.e0.00001.r500000.sllama3-8-1-4-8192.b000.w0', stage: 0, stageCount: 4, from: 0, to: 9, maxSessions: 16, registry: null,
  };
  assert.ok(Value.Check(DeploymentAssignment, a), JSON.stringify([...Value.Errors(DeploymentAssignment, a)].slice(0, 2)));
  assert.ok(!Value.Check(DeploymentAssignment, { ...a, bytes: 2 ** 53 }));
});
