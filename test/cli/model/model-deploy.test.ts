// nbcli model deploy --wait (waitServing): it returns once the deployment has
// served, also when a replica was lost before the next poll (CI saw the
// cheat of inference-checks.test.ts evicted between two polls, and the wait
// ran out); `npm start`'s serve step (once = false) waits for serving now.
// While it waits it says each miner's reason for refusing a stage, once, and
// the timeout's error repeats them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { DeploymentView } from '../../../src/api/deployments.ts';
import type { ModelClient } from '../../../src/api/model-client.ts';
import { deploymentLines, waitServing } from '../../../src/cli/model/model-deploy.ts';

const SHA = 'ab'.repeat(32);

function view(status: DeploymentView['status'], servingAt: number | null): DeploymentView {
  return {
    id: 'dep-1', sha256: SHA, name: 'moby-micro', owner: '0x' + '11'.repeat(20) as DeploymentView['owner'], model: 'gpt-micro', status, replicas: 1,
    requestedStages: 2, sessions: 4, stages: [], message: status === 'deploying' ? 'waiting for miners: stage 0 has 0 of 1 replicas' : null,
    refused: [], registry: null, idleLimitMs: 3_600_000, lastRequestAt: 0, createdAt: 0, servingAt, undeployedAt: null, undeployReason: null,
  };
}

/** A model client whose deployment goes through `views`, one per poll (the last one stays). */
function polled(views: DeploymentView[]): { client: ModelClient; polls: () => number } {
  let n = 0;
  const client = { get: async () => ({ deployment: views[Math.min(n++, views.length - 1)] }) } as unknown as ModelClient;
  return { client, polls: () => n };
}

test('--wait returns a deployment that served and lost a replica between two polls, and says so', async () => {
  const { client } = polled([view('deploying', 1_700_000_000_000)]);
  const lines: string[] = [];
  const d = await waitServing(client, SHA, view('deploying', null), 5_000, (l) => lines.push(l), true);
  assert.equal(d.status, 'deploying');
  assert.match(deploymentLines(d)[0], /deploying \(it served from 2023-11-14T22:13:20.000Z, then lost a replica\)/);
});

test('without once (npm start), the same deployment is waited on until it serves again, or the time runs out', async () => {
  const again = polled([view('deploying', 1), view('deploying', 1), view('serving', 1)]);
  assert.equal((await waitServing(again.client, SHA, view('deploying', null), 10_000, () => {})).status, 'serving');
  assert.equal(again.polls(), 3);
  const never = polled([view('deploying', 1)]);
  await assert.rejects(waitServing(never.client, SHA, view('deploying', null), 600, () => {}), /is not serving after 1 s/);
});

test('a deployment that never served is waited on with once too', async () => {
  const { client, polls } = polled([view('deploying', null), view('serving', 2)]);
  const d = await waitServing(client, SHA, view('deploying', null), 10_000, () => {}, true);
  assert.equal(d.status, 'serving');
  assert.equal(polls(), 2);
  assert.doesNotMatch(deploymentLines(d)[0], /lost a replica/);
});

test("while it waits, each miner's reason for refusing a stage is said once, and the timeout repeats them", async () => {
  const refusal = { id: '0x' + '22'.repeat(20) as DeploymentView['owner'], detail: "refused the orchestrator's chain: the orchestrator says it pays on rpc http://127.0.0.1:1, genesis 0x12345678…9abc", at: 5 };
  const refused = { ...view('deploying', null), refused: [refusal] };
  const { client } = polled([view('deploying', null), refused, refused]);
  const lines: string[] = [];
  await assert.rejects(waitServing(client, SHA, view('deploying', null), 1_600, (l) => lines.push(l), true), (err: Error) => {
    assert.match(err.message, /is not serving after 2 s: dep-1 deploying: waiting for miners: stage 0 has 0 of 1 replicas; refused by 0x2{40}: refused the orchestrator's chain/);
    return true;
  });
  assert.deepEqual(lines.filter((l) => l.includes('refused by')), [`  refused by ${refusal.id}: ${refusal.detail}`]);
});
