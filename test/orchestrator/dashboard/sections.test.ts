// The dashboard's miners section (src/orchestrator/dashboard/sections.ts):
// each miner's work per minute is the work done (forward, backward, merge,
// inference; not dropped or invalid) logged over about the last minute, null
// until the orchestrator has watched for a few seconds.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { DashboardSections, RATE_WINDOW_MS } from '../../../src/orchestrator/dashboard/sections.ts';
import { Harness } from '../helpers.ts';

let h: Harness;
after(() => h?.close());

test('work per minute: the work done over about the last minute, per miner; nothing else counts; null before the orchestrator watched', async () => {
  h = await Harness.open();
  const a = h.join('a');
  const b = h.join('b');
  const sections = new DashboardSections(h.coordinator, null, false, () => h.now);
  const rate = (id: string): number | null => sections.miners().find((m) => m.id === id)!.workPerMinute;
  const log = (minerId: string, kind: 'forward' | 'backward' | 'merge' | 'inference' | 'dropped' | 'invalid', units: number): void =>
    h.state.ledger.logWork({ minerId, runId: null, kind, units }, h.now);
  log(a.id, 'forward', 100); // before the first look: not in any window
  assert.equal(rate(a.id), null, 'nothing to compare with yet');
  h.now += 30_000;
  log(a.id, 'forward', 10);
  log(a.id, 'backward', 20);
  log(a.id, 'dropped', 1000);
  log(b.id, 'invalid', 1000);
  assert.equal(rate(a.id), 60, '30 units in 30 s');
  assert.equal(rate(b.id), 0, 'invalid work is not work done');
  // a minute later: the window starts at the mark a minute old (the one taken at 30 s), so the first 30 units fall out
  h.now += RATE_WINDOW_MS;
  log(a.id, 'inference', 6);
  log(b.id, 'merge', 3);
  assert.equal(rate(a.id), 6);
  assert.equal(rate(b.id), 3);
});
