// Starter specs written by `nbcli job init [--template gpt|classifier]`:
// valid as they are, small enough to try with `nbcli job run --local`.
import type { JobSpec } from './spec.ts';

export const JOB_TEMPLATES = {
  /** a byte-level GPT on Moby Dick */
  gpt: {
    name: 'moby-gpt',
    model: 'gpt-tiny',
    data: 'moby-dick',
    training: { steps: 2000, batchSize: 12, learningRate: 0.001, mergeEvery: 100, seed: 1337 },
    checkpointEvery: 500,
    limits: { timeout: '6h', idleTimeout: '10m', deadline: '2h' },
    budget: '50',
  },
  /** a spam classifier on the SpamAssassin corpus (hashed byte n-grams, an MLP) */
  classifier: {
    name: 'spam-classifier',
    model: { type: 'mlp', inputs: 4096, hidden: [64], classes: 2 },
    data: 'spam-assassin',
    training: { steps: 2000, batchSize: 64, learningRate: 0.01, mergeEvery: 50, seed: 1337 },
    checkpointEvery: 200,
    limits: { timeout: '1h', idleTimeout: '10m', deadline: '30m' },
    budget: '5',
  },
} as const satisfies Record<string, JobSpec>;

export type JobTemplate = keyof typeof JOB_TEMPLATES;
