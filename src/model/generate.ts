// Sampling text from a whole-model stage: feed the last `context` bytes, take
// the logits of the last position, sample with a temperature.
import type { GptStage } from './gpt.ts';
import { hashSeed, mulberry32 } from './init.ts';

export interface SampleOptions {
  /** bytes to generate */
  length: number;
  /** 0 = greedy */
  temperature?: number;
  seed?: number;
}

export function generateBytes(model: GptStage, prompt: Uint8Array, options: SampleOptions): Uint8Array {
  if (!model.isFirst || !model.isLast) throw new Error('generation needs the whole model in one stage');
  const { contextLength: ctx, vocabSize: V } = model.config;
  const temperature = options.temperature ?? 0.8;
  const rand = mulberry32(hashSeed(options.seed ?? 0, 'sample'));
  const seq: number[] = Array.from(prompt.length ? prompt : new Uint8Array([10]));
  const out = new Uint8Array(options.length);
  const probs = new Float64Array(V);
  for (let n = 0; n < options.length; n++) {
    const window = seq.slice(-ctx);
    const T = window.length;
    const logits = model.forward(Int32Array.from(window), 1, T) as Float32Array;
    const row = logits.subarray((T - 1) * V, T * V);
    let next = 0;
    if (temperature <= 0) {
      for (let v = 1; v < V; v++) if (row[v] > row[next]) next = v;
    } else {
      let max = -Infinity;
      for (let v = 0; v < V; v++) max = Math.max(max, row[v]);
      let sum = 0;
      for (let v = 0; v < V; v++) sum += probs[v] = Math.exp((row[v] - max) / temperature);
      let r = rand() * sum;
      next = V - 1;
      for (let v = 0; v < V; v++) {
        r -= probs[v];
        if (r <= 0) {
          next = v;
          break;
        }
      }
    }
    seq.push(next);
    out[n] = next;
  }
  return out;
}

/** Bytes as printable text (invalid UTF-8 replaced). */
export function bytesToText(bytes: Uint8Array): string {
  return new TextDecoder('utf-8', { fatal: false }).decode(bytes);
}
