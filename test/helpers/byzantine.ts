// Dishonest miners, one of each kind the network defends against
// (docs/security.md), as fault injections of a real miner
// (src/miner/tamper.ts). The Byzantine end-to-end test
// (test/network/byzantine.test.ts) and benchmark (bench/trust.bench.ts) run
// each in a process of its own (./byzantine-miner.ts).
import type { WorkReport } from '../../src/protocol/messages.ts';
import type { Tamper } from '../../src/miner/tamper.ts';

export const KINDS = ['honest', 'inflate', 'blame', 'poison', 'lazy'] as const;
export type Kind = (typeof KINDS)[number];

/** What each kind does (`honest`: nothing). */
export const KIND_DOING: Record<Kind, string> = {
  honest: 'follows the protocol',
  inflate: 'repeats each claim ten times, claims attempts never issued and its neighbours\' microbatches',
  blame: 'reports the hops it handed on as refused by the receiver, or with a receipt the receiver never signed',
  poison: 'uploads its pseudo-gradient ×1000 claiming a million inner steps, and merges partitions to 0.5',
  lazy: 'keeps its weights at zero (each block passes its input through) and never steps',
};

/** Reports a heartbeat carries at most (src/protocol/messages.ts). */
const MAX_REPORTS = 4096;

function inflate(reports: WorkReport[]): WorkReport[] {
  const out: WorkReport[] = [];
  for (const r of reports) {
    for (let i = 0; i < 10; i++) out.push(r);
    if (r.phase === 'dropped') continue;
    out.push({ ...r, attempt: r.attempt + 1 });
    if (r.phase === 'forward' && r.stage === 0) out.push({ ...r, microbatch: r.microbatch + 1 });
  }
  return out.slice(0, MAX_REPORTS);
}

/** A signature the receiver never made: the first character changed. */
function forged(receipt: string): string {
  return (receipt[0] === 'A' ? 'B' : 'A') + receipt.slice(1);
}

function blame(reports: WorkReport[]): WorkReport[] {
  let n = 0;
  return reports.map((r) => {
    if (!r.next || !r.receipt) return r;
    if (n++ % 2) return { ...r, receipt: forged(r.receipt) };
    return { runId: r.runId, microbatch: r.microbatch, attempt: r.attempt, stage: r.stage, phase: 'dropped', next: r.next, bytesSent: 0, reason: 'the next hop refused the frame' };
  });
}

export function tamperOf(kind: Kind): Tamper {
  switch (kind) {
    case 'honest':
      return {};
    case 'inflate':
      return { reports: inflate };
    case 'blame':
      return { reports: blame };
    case 'poison':
      return { pseudoGradient: (d) => d.forEach((x, i) => (d[i] = x * 1000)), samples: () => 1_000_000, merged: (m) => m.fill(0.5) };
    case 'lazy':
      return { lazy: true };
  }
}

export function isKind(s: string): s is Kind {
  return (KINDS as readonly string[]).includes(s);
}
