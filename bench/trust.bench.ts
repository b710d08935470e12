// The Byzantine benchmark (issue "Trust"): the same run trained on paid local
// networks of real processes, twice by 4 honest miners alone, once by 4
// honest miners and one dishonest miner of each kind the network defends
// against (test/helpers/byzantine.ts: inflating reports, blaming, poisoning
// merges, lazy weights), every miner staking the minimum. Figures:
//   trust.byzantine.loss_ratio        held-out loss of the Byzantine run over the honest runs' mean
//   trust.honest.rerun_loss_ratio     the second honest run's over the first's: the noise of the comparison
//                                     (placement follows measured speed, and the pipeline is asynchronous)
//   trust.honest_share_of_rewards     the honest miners' share of everything the Byzantine run paid
//   trust.dishonest_max_earned_ratio  the best-paid cheater over the least-paid honest miner
//   trust.honest_charged_units        dropped + invalid + failed-check units charged to honest miners
//   trust.cheaters_slashed            cheaters slashed (of 4)
// and, in one process, how far apart honest replicas' pseudo-gradients are
// (what the merge's norm bound rests on, src/merge/merge-partition.ts):
//   merge.honest_norm_spread.rR.hH    the largest norm of an honest replica's partition slice over the
//                                     median the clipping rule compares it to (clipped past CLIP_FACTOR),
//                                     R replicas merging every H inner steps
//   merge.honest_clipped_share.rR.hH  the share of honest slices the rule clipped
// and who may read what (./trust-reads.ts): trust.blob_reads_refused, what storing costs
// (./trust-storage.ts: trust.storage.cost_per_gb_day), an
// outsider's and a throwaway-key miner's reads of a developer's blobs of every
// kind refused, of trust.blob_reads_attempted.
import { storageCostBench } from './trust-storage.ts';
import { join } from 'node:path';
import { parseEther, type Address } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { batchForShard } from '../src/data/batches.ts';
import { loadCorpus } from '../src/data/corpus.ts';
import { Engine } from '../src/engine/engine.ts';
import { signerFor } from '../src/chain/client.ts';
import { loadOrCreateKeyFile } from '../src/chain/key-file.ts';
import { openChain } from '../src/chain/session.ts';
import { addStake } from '../src/chain/staking.ts';
import { ensureGas, faucet } from '../src/chain/token.ts';
import { CLIP_FACTOR, l2Norm, median, normBound } from '../src/merge/merge-partition.ts';
import { partitionVector } from '../src/merge/partition.ts';
import { AdamW, ADAMW_DEFAULTS } from '../src/model/adamw.ts';
import { loadStageFrom } from '../src/model/checkpoint.ts';
import { gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { partCount } from '../src/model/parts.ts';
import { decodeSafetensors } from '../src/model/safetensors.ts';
import type { CreateRunRequest, EpochView, WorkTotal } from '../src/api/schemas.ts';
import { heldoutLoss } from '../src/train/local.ts';
import type { Kind } from '../test/helpers/byzantine.ts';
import { Cluster } from '../test/network/helpers.ts';
import type { Bench, BenchResult } from './harness.ts';
import { blobReadsBench } from './trust-reads.ts';

/** The run both networks train (it starts once every miner has joined): gpt-micro, 2 stages, merges every 10 inner steps. */
const RUN: CreateRunRequest = { model: 'gpt-micro', data: 'moby-dick', steps: 600, stages: 2, batchSize: 8, mergeEvery: 10, seed: 7 };
const STAKE = parseEther('10');
const HONEST: Kind[] = ['honest', 'honest', 'honest', 'honest'];
const CHEATS: Kind[] = ['inflate', 'blame', 'poison', 'lazy'];

interface Outcome {
  loss: number;
  earned: Map<string, bigint>;
  kindOf: Map<string, Kind>;
  work: WorkTotal[];
  slashes: EpochView['slashes'];
  seconds: number;
  /** replicas per stage when the run completed */
  placement: number[];
}

/** Starts a paid network of one miner per entry of `kinds` (each staking the minimum), trains RUN, and reads what came of it. */
async function train(kinds: Kind[], log: (line: string) => void): Promise<Outcome> {
  const cluster = new Cluster();
  const t0 = performance.now();
  try {
    process.env.NIMBLE_CHAIN_RPC = '';
    await cluster.startOrchestrator(['--epoch-rounds', '5', '--emission', '100', '--check-rate', '0.05', '--min-stake', '10'], { chain: true });
    const session = await openChain({ dataDir: join(cluster.dir, 'orch') });
    const kindOf = new Map<string, Kind>();
    try {
      const names = kinds.map((k, i) => `${k}-${i}`);
      for (const [i, name] of names.entries()) {
        const { privateKey, address } = loadOrCreateKeyFile(join(cluster.dir, name, 'miner-key.json'));
        kindOf.set(address, kinds[i]);
        await faucet(session.client, address as Address, STAKE);
        await ensureGas(session.client, address as Address);
        await addStake(session.client, signerFor(session.client, privateKeyToAccount(privateKey)), STAKE);
      }
      // one at a time, so each measures its speed on an idle machine: the plan (and the replicas per stage left after the
      // cheaters are evicted) then follows from the miners' counts, not from which of them happened to measure in a crowd
      for (const [i, name] of names.entries()) await cluster.startByzantine(name, kinds[i]);
      const run = await cluster.createRun({ ...RUN, minMiners: kinds.length });
      let shown = 0;
      const done = await cluster.waitRun(
        run.id,
        (v) => {
          if (performance.now() - shown > 20_000) {
            shown = performance.now();
            log(`${v.microbatchesDone}/${RUN.steps} microbatches, loss ${v.loss?.toFixed(3)}, ${v.mergesDone} merges`);
          }
          return v.status === 'completed' || v.status === 'failed';
        },
        1_800_000,
      );
      if (done.status !== 'completed') throw new Error(`the run ${done.status}: ${done.message}`);
      // every closed epoch settled and every slash sent
      let epochs: EpochView[] = [];
      for (let i = 0; i < 600; i++) {
        epochs = await cluster.epochs();
        const settled = epochs.filter((e) => e.status !== 'open').every((e) => e.status === 'settled');
        if (settled && epochs.flatMap((e) => e.slashes).every((s) => s.status !== 'pending')) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      const earned = new Map<string, bigint>();
      for (const r of epochs.flatMap((e) => e.rewards)) earned.set(r.miner, (earned.get(r.miner) ?? 0n) + BigInt(r.amountWei));
      const bytes = await cluster.api.checkpoint(run.id);
      const placement = done.stages.map((st) => st.replicas.filter((r) => r.alive).length);
      return { loss: await evaluate(bytes), earned, kindOf, work: await cluster.api.work(), slashes: epochs.flatMap((e) => e.slashes), seconds: (performance.now() - t0) / 1000, placement };
    } finally {
      await session.close();
    }
  } finally {
    await cluster.stopGracefully();
  }
}

/** Held-out loss of a whole-model checkpoint (200 batches of 8). */
async function evaluate(bytes: Uint8Array): Promise<number> {
  const engine = await Engine.create();
  try {
    const config = gptConfig(RUN.model);
    const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 8 });
    loadStageFrom(model, decodeSafetensors(bytes));
    const loss = heldoutLoss(model, loadCorpus('moby-dick'), 200, 8);
    model.release();
    return loss;
  } finally {
    await engine.close();
  }
}

/**
 * Honest replicas' pseudo-gradient norms against the clipping rule: R replicas
 * of the whole of `model`, each with its own AdamW (lr 1e-3, the run default),
 * start every round from the same weights, take H steps on their own shards,
 * and are averaged (outer lr 1); per round and partition (two per replica)
 * each replica's slice norm is compared with the rule's median (the
 * replicas' and the previous round's median).
 */
async function honestNormSpread(model: string, replicas: number, H: number, rounds: number): Promise<{ spread: number; clipped: number }> {
  const engine = await Engine.create();
  const corpus = loadCorpus('moby-dick');
  const config = gptConfig(model);
  const B = 8;
  const T = config.contextLength;
  const range = { from: 0, to: partCount(config) };
  const stages = Array.from({ length: replicas }, () => new GptStage(engine, config, range, { batchSize: B, seed: 7 }));
  const opts = stages.map((st) => new AdamW(engine, st.params, st.grads, { ...ADAMW_DEFAULTS, lr: 1e-3 }));
  try {
    const n = stages[0].paramCount;
    const partitions = partitionVector(n, 2 * replicas);
    let previous: number[] | null = null;
    let spread = 0;
    let clipped = 0;
    let slices = 0;
    let shard = 0;
    for (let round = 0; round < rounds; round++) {
      const start = stages[0].params.flat.data.slice();
      const pgs = stages.map((st) => {
        for (let step = 0; step < H; step++) {
          const batch = batchForShard(corpus.train, 7, shard++, B, T);
          st.zeroGrad();
          st.forward(batch.inputs, B, T, batch.targets);
          st.backward();
          opts[stages.indexOf(st)].update();
        }
        const w = st.params.flat.data;
        const pg = new Float32Array(n);
        for (let i = 0; i < n; i++) pg[i] = start[i] - w[i];
        return pg;
      });
      const medians: number[] = [];
      for (const p of partitions) {
        const norms = pgs.map((pg) => l2Norm(pg.subarray(p.start, p.end)));
        const reference = normBound(norms, previous?.[p.index] ?? null) / CLIP_FACTOR;
        for (const x of norms) {
          spread = Math.max(spread, x / reference);
          if (x > CLIP_FACTOR * reference) clipped++;
          slices++;
        }
        medians.push(median(norms));
      }
      previous = medians;
      const merged = start.slice();
      for (const pg of pgs) for (let i = 0; i < n; i++) merged[i] -= pg[i] / replicas;
      for (const st of stages) st.params.flat.data.set(merged);
    }
    return { spread, clipped: clipped / slices };
  } finally {
    for (const o of opts) o.release();
    for (const st of stages) st.release();
    await engine.close();
  }
}

export const trustBenches: Bench[] = [
  blobReadsBench,
  storageCostBench,
  {
    group: 'trust',
    async run(o): Promise<BenchResult[]> {
      const out: BenchResult[] = [];
      for (const R of [2, 4]) {
        for (const H of [10, 100]) {
          const rounds = H === 10 ? 30 : 6;
          o.log(`honest pseudo-gradient norms: ${R} replicas of ${RUN.model}, H = ${H}, ${rounds} rounds`);
          const { spread, clipped } = await honestNormSpread(RUN.model, R, H, rounds);
          out.push({ bench: `merge.honest_norm_spread.r${R}.h${H}`, value: Number(spread.toFixed(4)), unit: `x median (clip at ${CLIP_FACTOR})` });
          out.push({ bench: `merge.honest_clipped_share.r${R}.h${H}`, value: clipped, unit: 'share' });
        }
      }
      return out;
    },
  },
  {
    group: 'trust',
    async run(o): Promise<BenchResult[]> {
      const honestRuns: Outcome[] = [];
      for (let i = 0; i < 2; i++) {
        o.log(`4 honest miners train ${RUN.model} (${RUN.steps} microbatches of ${RUN.batchSize}), run ${i + 1} of 2`);
        const h = await train(HONEST, o.log);
        o.log(`held-out loss ${h.loss.toFixed(4)} in ${h.seconds.toFixed(0)} s, replicas per stage at the end ${h.placement.join('+')}`);
        honestRuns.push(h);
      }
      const honestLoss = (honestRuns[0].loss + honestRuns[1].loss) / 2;
      o.log(`now 4 honest + ${CHEATS.join(', ')}`);
      const byz = await train([...HONEST, ...CHEATS], o.log);
      o.log(`held-out loss ${byz.loss.toFixed(4)} in ${byz.seconds.toFixed(0)} s, replicas per stage at the end ${byz.placement.join('+')}`);
      const isHonest = (a: string): boolean => byz.kindOf.get(a) === 'honest';
      const miners = [...byz.kindOf.keys()];
      const paid = (a: string): bigint => byz.earned.get(a) ?? 0n;
      const total = miners.reduce((s, a) => s + paid(a), 0n);
      const honestPaid = miners.filter(isHonest).reduce((s, a) => s + paid(a), 0n);
      const leastHonest = miners.filter(isHonest).reduce((m, a) => (paid(a) < m ? paid(a) : m), paid(miners.find(isHonest)!));
      const bestCheat = miners.filter((a) => !isHonest(a)).reduce((m, a) => (paid(a) > m ? paid(a) : m), 0n);
      const charged = byz.work.filter((w) => isHonest(w.miner) && ['dropped', 'invalid', 'failed_check'].includes(w.kind)).reduce((s, w) => s + w.units, 0);
      const slashed = new Set(byz.slashes.filter((s) => s.status === 'slashed' && !isHonest(s.miner)).map((s) => s.miner)).size;
      for (const a of miners) {
        const units = (kind: string): number => byz.work.filter((w) => w.miner === a && w.kind === kind).reduce((s, w) => s + w.units, 0);
        o.log(`${byz.kindOf.get(a)} ${a.slice(0, 10)}: earned ${(Number(paid(a)) / 1e18).toFixed(2)} NIM; fwd ${units('forward')} bwd ${units('backward')} merge ${units('merge')} dropped ${units('dropped')} invalid ${units('invalid')} failed ${units('failed_check')}`);
      }
      return [
        { bench: 'trust.byzantine.loss_ratio', value: Number((byz.loss / honestLoss).toFixed(4)), unit: 'ratio' },
        { bench: 'trust.honest.rerun_loss_ratio', value: Number((honestRuns[1].loss / honestRuns[0].loss).toFixed(4)), unit: 'ratio' },
        { bench: 'trust.byzantine.heldout_loss', value: Number(byz.loss.toFixed(4)), unit: 'nats/byte' },
        { bench: 'trust.honest.heldout_loss', value: Number(honestLoss.toFixed(4)), unit: 'nats/byte' },
        { bench: 'trust.honest_share_of_rewards', value: Number((Number(honestPaid) / Number(total)).toFixed(4)), unit: 'share' },
        { bench: 'trust.dishonest_max_earned_ratio', value: Number((Number(bestCheat) / Number(leastHonest)).toFixed(4)), unit: 'ratio' },
        { bench: 'trust.honest_charged_units', value: charged, unit: 'units' },
        { bench: 'trust.cheaters_slashed', value: slashed, unit: `of ${CHEATS.length}` },
      ];
    },
  },
];
