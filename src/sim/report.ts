// The report of a finished simulation: the stage cut, replicas, utilization,
// throughput, bytes per token, merges, dropped work and earnings per class.
import type { Plan } from '../planner/types.ts';
import { modelParams } from './models.ts';
import type { ClassReport, SimReport } from './types.ts';
import type { World } from './world.ts';

/** 1 NIM in wei. */
const WEI = 10n ** 18n;

export function buildReport(w: World, initial: Plan): SimReport {
  const o = w.options;
  const end = w.horizonMs;
  const hoursAlive = (m: { joinedAt: number; leftAt: number | null }): number => (Math.min(end, m.leftAt ?? end) - m.joinedAt) / 3_600_000;
  const finalPlan = w.plan ?? initial;
  const totalParams = finalPlan.stages.reduce((a, s) => a + s.params, 0);
  const shares = finalPlan.stages.map((s) => s.params / totalParams);
  const paid = w.ledger.payouts(shares, o.emission);

  const classes = new Map<string, ClassReport & { busyMs: number; aliveMs: number; hours: number; wei: bigint }>();
  for (const m of w.miners) {
    let c = classes.get(m.hardware);
    if (!c) {
      c = { hardware: m.hardware, miners: 0, assignedAtEnd: 0, utilization: 0, earnedNim: 0, nimPerMinerHour: 0, busyMs: 0, aliveMs: 0, hours: 0, wei: 0n };
      classes.set(m.hardware, c);
    }
    c.miners++;
    if (m.alive && m.stage >= 0) c.assignedAtEnd++;
    c.busyMs += Math.min(m.busyMs, Math.max(0, end - m.joinedAt));
    c.hours += hoursAlive(m);
    c.wei += paid.get(m.id) ?? 0n;
  }
  const classReports: ClassReport[] = [...classes.values()]
    .map((c) => {
      const earnedNim = Number((c.wei * 1_000_000n) / WEI) / 1e6;
      return {
        hardware: c.hardware,
        miners: c.miners,
        assignedAtEnd: c.assignedAtEnd,
        utilization: c.hours > 0 ? c.busyMs / (c.hours * 3_600_000) : 0,
        earnedNim,
        nimPerMinerHour: c.hours > 0 ? earnedNim / c.hours : 0,
      };
    })
    .sort((a, b) => b.nimPerMinerHour - a.nimPerMinerHour || a.hardware.localeCompare(b.hardware));

  let assignedBusy = 0;
  let assignedMs = 0;
  const holders: [number, number][] = [];
  for (const m of w.miners) {
    if (m.stage < 0 && m.busyMs === 0) continue;
    const until = Math.min(end, m.leftAt ?? end);
    assignedBusy += m.busyMs;
    assignedMs += until - m.joinedAt;
    holders.push([m.joinedAt, until]);
  }
  const seconds = end / 1000;
  const tokens = w.counters.done * w.tokensPerMicrobatch;
  const mergeMs = w.counters.mergeMs;
  const perReplica = w.counters.mergeBytesPerReplica;
  const memoryPerMiner = Math.max(...initial.stages.map((s) => s.memoryBytes));
  return {
    model: o.modelName,
    params: modelParams(o.config),
    miners: o.miners,
    hours: o.hours,
    seed: o.seed,
    batchSize: o.batchSize,
    slots: o.slots,
    codec: o.codec,
    activationRatio: o.activationRatio,
    route: o.route,
    memoryModel: o.memoryModel,
    mergeEvery: o.mergeEvery,
    stages: initial.stages.map((s, i) => ({
      range: { ...s.range },
      params: s.params,
      memoryBytes: s.memoryBytes,
      replicas: s.miners.length,
      replicasAtEnd: w.members[i]?.size ?? 0,
      plannedTokensPerS: s.throughputTokensPerS,
    })),
    memoryPerMinerBytes: memoryPerMiner,
    plannedTokensPerS: initial.bottleneckTokensPerS,
    tokensPerS: tokens / seconds,
    microbatchesDone: w.counters.done,
    utilization: w.timeline.aliveMs > 0 ? w.timeline.busyMs / w.timeline.aliveMs : 0,
    utilizationAssigned: assignedMs > 0 ? Math.min(1, assignedBusy / assignedMs) : 0,
    bytesPerToken: {
      activations: tokens > 0 ? w.counters.activationBytes / tokens : 0,
      merges: tokens > 0 ? w.counters.mergeBytes / tokens : 0,
      total: tokens > 0 ? (w.counters.activationBytes + w.counters.mergeBytes) / tokens : 0,
    },
    merges: {
      rounds: w.counters.mergeRounds,
      meanMs: mergeMs.length ? mergeMs.reduce((a, b) => a + b, 0) / mergeMs.length : 0,
      maxMs: mergeMs.length ? Math.max(...mergeMs) : 0,
      bytesPerReplicaPerRound: perReplica.length ? perReplica.reduce((a, b) => a + b, 0) / perReplica.length : 0,
    },
    dropped: {
      units: w.counters.droppedUnits,
      reissued: w.counters.reissued,
      byDeadline: w.counters.byDeadline,
      byChurn: w.counters.byChurn,
      noPeer: w.counters.noPeer,
      wastedComputeMs: w.counters.wastedComputeMs,
    },
    churn: { left: w.counters.left, joined: w.counters.joined, replans: w.counters.replans, moves: w.counters.moves, fullReplans: w.counters.fullReplans },
    classes: classReports,
    series: w.timeline.series(holders),
    events: w.counters.events,
    stalled: w.stalled,
  };
}
