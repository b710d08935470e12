// A spot-check bundle: what a miner uploads when the orchestrator asks it to
// prove one of its forwards. Three frames in one body:
//
//   'NCHK' | u32 version | u32 len(weights) | u32 len(input) | u32 len(output) | frames...
//
//   weights  f32 [paramCount]: the stage's weights the forward used;
//            meta {runId, microbatch, stage, round, samples, shard}
//   input    the activation frame exactly as received (empty for stage 0,
//            which loads its batch from the shard)
//   output   the activation frame exactly as sent (empty for the last stage,
//            whose output is the loss it reported)
//
// Frames keep their sha256, so the orchestrator can compare the input and
// output with what the miners committed to in their work reports.
import { Type, type Static } from '@sinclair/typebox';
import { FrameError } from './errors.ts';
import { decodeFrame, encodeFrame, readFrameHeader, type DecodedFrame } from './frame.ts';
import { parse } from './messages.ts';

export const CHECK_MAGIC = 'NCHK';
export const CHECK_VERSION = 1;
const PREFIX = 20;

const Count = Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 });
export const CheckMeta = Type.Object({
  runId: Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_.:-]+$' }),
  microbatch: Type.Integer({ minimum: 1, maximum: 2 ** 31 - 1 }),
  stage: Type.Integer({ minimum: 0, maximum: 1023 }),
  round: Count,
  /** inner steps since the last merge when the forward ran */
  samples: Count,
  shard: Count,
});
export type CheckMeta = Static<typeof CheckMeta>;

export interface CheckBundle {
  meta: CheckMeta;
  weights: Float32Array;
  /** the received activation frame (null for stage 0) */
  input: Uint8Array | null;
  /** the sent activation frame (null for the last stage) */
  output: Uint8Array | null;
}

export function encodeCheckBundle(b: CheckBundle): Uint8Array {
  const w = encodeFrame(b.weights, [b.weights.length], 'f32', { ...b.meta });
  const input = b.input ?? new Uint8Array(0);
  const output = b.output ?? new Uint8Array(0);
  const out = new Uint8Array(PREFIX + w.length + input.length + output.length);
  const view = new DataView(out.buffer);
  out.set(new TextEncoder().encode(CHECK_MAGIC), 0);
  view.setUint32(4, CHECK_VERSION, true);
  view.setUint32(8, w.length, true);
  view.setUint32(12, input.length, true);
  view.setUint32(16, output.length, true);
  out.set(w, PREFIX);
  out.set(input, PREFIX + w.length);
  out.set(output, PREFIX + w.length + input.length);
  return out;
}

export interface CheckExpect {
  paramCount: number;
  /** rows x channels of an activation */
  activationShape: readonly number[];
  /** whether the checked stage received an input frame / sent an output frame */
  hasInput: boolean;
  hasOutput: boolean;
  maxBytes: number;
}

export interface DecodedCheckBundle {
  meta: CheckMeta;
  weights: Float32Array;
  input: DecodedFrame | null;
  inputSha: string | null;
  output: DecodedFrame | null;
  outputSha: string | null;
}

/**
 * Decodes and validates a bundle: prefix, lengths adding up exactly, each
 * frame's shape, codec, sha256 and finiteness, the weights' meta. Throws
 * FrameError (or MessageError for the meta).
 */
export function decodeCheckBundle(bytes: Uint8Array, expect: CheckExpect): DecodedCheckBundle {
  if (bytes.length > expect.maxBytes) throw new FrameError('too_large', `check bundle is ${bytes.length} bytes, limit ${expect.maxBytes}`);
  if (bytes.length < PREFIX) throw new FrameError('truncated', `check bundle is ${bytes.length} bytes, shorter than its ${PREFIX}-byte prefix`);
  if (new TextDecoder().decode(bytes.subarray(0, 4)) !== CHECK_MAGIC) throw new FrameError('bad_magic', 'not a check bundle (magic)');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint32(4, true);
  if (version !== CHECK_VERSION) throw new FrameError('bad_version', `check bundle version ${version}, expected ${CHECK_VERSION}`);
  const lens = [view.getUint32(8, true), view.getUint32(12, true), view.getUint32(16, true)];
  const total = PREFIX + lens[0] + lens[1] + lens[2];
  if (total !== bytes.length) throw new FrameError(total > bytes.length ? 'truncated' : 'length_mismatch', `check bundle declares ${total} bytes, has ${bytes.length}`);
  if ((lens[1] > 0) !== expect.hasInput) throw new FrameError('bad_header', expect.hasInput ? 'the bundle lacks the input frame' : 'this stage has no input frame');
  if ((lens[2] > 0) !== expect.hasOutput) throw new FrameError('bad_header', expect.hasOutput ? 'the bundle lacks the output frame' : 'this stage has no output frame');
  const part = (i: number): Uint8Array => {
    const start = PREFIX + lens.slice(0, i).reduce((a, b) => a + b, 0);
    return bytes.subarray(start, start + lens[i]);
  };
  const w = decodeFrame(part(0), { shape: [expect.paramCount], codecs: ['f32'], maxBytes: expect.maxBytes });
  const meta = parse(CheckMeta, w.meta, 'check meta');
  const activation = (i: number): { frame: DecodedFrame; sha: string } | null => {
    if (lens[i] === 0) return null;
    const bytesI = part(i);
    const sha = readFrameHeader(bytesI, { maxBytes: expect.maxBytes }).header.sha256;
    return { frame: decodeFrame(bytesI, { shape: expect.activationShape, codecs: ['f32', 'f16', 'int8-row'], maxBytes: expect.maxBytes }), sha };
  };
  const input = activation(1);
  const output = activation(2);
  return { meta, weights: w.data, input: input?.frame ?? null, inputSha: input?.sha ?? null, output: output?.frame ?? null, outputSha: output?.sha ?? null };
}
