// The job routes' reads in process (src/orchestrator/routes/jobs.ts): a job's
// plan is made once per set of miners alive, however many anonymous callers
// ask for it, and made again when a miner joins; the public part and the
// whole; a page of jobs and its cursor. (The same attacks on real processes:
// test/network/reads.test.ts.)
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { JobEntry, JobPage } from '../../../src/api/jobs.ts';
import { Value } from '@sinclair/typebox/value';
import { buildApi } from '../../../src/orchestrator/http.ts';
import { JobService } from '../../../src/orchestrator/jobs/jobs.ts';
import { RequestSigner } from '../../../src/protocol/signing.ts';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { Harness, MODEL } from '../helpers.ts';

test("a job's plan is made once for the miners alive, then again when they change; anyone reads a job's public part, its owner the whole; the list pages", async () => {
  const h = await Harness.open();
  after(() => h.close());
  const jobs = new JobService(h.coordinator, { checkpointRetentionMs: 60_000, slots: h.coordinator.slots }, () => h.now);
  let planned = 0;
  const plan = jobs.plan.bind(jobs);
  jobs.plan = (id: string) => (planned++, plan(id));
  const app = buildApi(h.coordinator, null, jobs);
  after(() => app.close());
  h.joinMany('m', 2);
  const key = generatePrivateKey();
  const owner = privateKeyToAccount(key).address;
  const signer = new RequestSigner(key, { domain: h.coordinator.identity.domain });
  const ids = [0, 1, 2].map((i) => ((h.now += 1), jobs.submit({ name: `job-${i}`, model: MODEL, data: 'moby-dick', training: { steps: 50, batchSize: 2, mergeEvery: 10 } }, owner).id));

  // many anonymous calls: one plan
  const first = await app.inject({ method: 'GET', url: `/jobs/${ids[0]}/plan` });
  assert.equal(first.statusCode, 200, first.body);
  for (let i = 0; i < 20; i++) assert.equal((await app.inject({ method: 'GET', url: `/jobs/${ids[0]}/plan` })).body, first.body);
  assert.equal(planned, 1);
  // a miner joins: the plan is made again (once)
  h.join('m-new');
  await app.inject({ method: 'GET', url: `/jobs/${ids[0]}/plan` });
  await app.inject({ method: 'GET', url: `/jobs/${ids[0]}/plan` });
  assert.equal(planned, 2);

  // the public part to anyone, the whole to its owner's signature
  const anonymous = JSON.parse((await app.inject({ method: 'GET', url: `/jobs/${ids[0]}` })).body) as JobEntry;
  assert.ok(Value.Check(JobEntry, anonymous) && !('spec' in anonymous) && typeof anonymous.checkpoints === 'number', JSON.stringify(anonymous));
  const signed = await app.inject({ method: 'GET', url: `/jobs/${ids[0]}`, headers: await signer.sign('GET', `/jobs/${ids[0]}`) });
  const whole = JSON.parse(signed.body) as { owner: string; spec: { name: string } };
  assert.equal(whole.owner, owner);
  assert.equal(whole.spec.name, 'job-0');
  // a bad signature on a route that may be signed is refused, not read as anonymous
  const forged = { ...(await signer.sign('GET', `/jobs/${ids[0]}`)), 'x-nimble-signature': `0x${'1'.repeat(130)}` };
  assert.equal((await app.inject({ method: 'GET', url: `/jobs/${ids[0]}`, headers: forged })).statusCode, 401);

  // pages: newest first, two by two, the cursor going on where the last ended
  const page = async (q: string): Promise<JobPage> => JSON.parse((await app.inject({ method: 'GET', url: `/jobs?${q}` })).body) as JobPage;
  const p1 = await page('limit=2');
  assert.deepEqual(p1.jobs.map((j) => j.id), [ids[2], ids[1]]);
  assert.ok(p1.next);
  const p2 = await page(`limit=2&cursor=${p1.next}`);
  assert.deepEqual(p2.jobs.map((j) => j.id), [ids[0]]);
  assert.equal(p2.next, null);
  // one owner's list is its own to ask for: anonymous or another's signature, 403
  const mine = await app.inject({ method: 'GET', url: `/jobs?owner=${owner}&limit=5`, headers: await signer.sign('GET', `/jobs?owner=${owner}&limit=5`) });
  assert.equal((JSON.parse(mine.body) as JobPage).jobs.length, 3, mine.body);
  assert.equal((await app.inject({ method: 'GET', url: `/jobs?owner=${owner}` })).statusCode, 403);
  const other = `0x${'0'.repeat(40)}`;
  assert.equal((await app.inject({ method: 'GET', url: `/jobs?owner=${other}`, headers: await signer.sign('GET', `/jobs?owner=${other}`) })).statusCode, 403);
  for (const q of ['limit=0', 'limit=201', 'cursor=nope', 'cursor=1.job-xyz']) assert.equal((await app.inject({ method: 'GET', url: `/jobs?${q}` })).statusCode, 400, q);
});
