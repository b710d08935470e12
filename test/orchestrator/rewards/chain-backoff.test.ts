// A failing epoch settlement and a failing slash back off (src/orchestrator/rewards/backoff.ts),
// against a real anvil node, on a clock the test moves by hand: the
// orchestrator signs with a key that holds no role, so the chain refuses
// every send; two minutes of 500 ms passes try each 7 times (at 0, 1, 3, 7,
// 15, 31, 63 s), not 240, each try logged, its tries, next try and error on
// its row and in GET /epochs' view. A restarted orchestrator (a new Epochs on
// the same state) waits out the recorded next try before sending again; once
// the chain takes it, the slash is sent once.
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parseEther } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { ChainClient, SigningClient } from '../../../src/chain/client.ts';
import { signerFor } from '../../../src/chain/client.ts';
import { addStake, readStake } from '../../../src/chain/staking.ts';
import { faucet } from '../../../src/chain/token.ts';
import { retryDelayMs } from '../../../src/orchestrator/rewards/backoff.ts';
import { Epochs } from '../../../src/orchestrator/rewards/epochs.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { epochView } from '../../../src/orchestrator/views.ts';
import { startTestChain, tempDir, type TestChain } from '../../chain/helpers.ts';

let chain: TestChain;
let dir: string;
before(async () => {
  chain = await startTestChain();
  dir = tempDir('chain-backoff');
});
after(async () => {
  await chain?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const T0 = 1_000_000;
/** The passes of two minutes at the orchestrator's 500 ms interval. */
const PASSES = 240;

/** The chain client, counting the contract calls simulated before each send, by function name. */
function counting(client: ChainClient): { client: ChainClient; sends: Map<string, number> } {
  const sends = new Map<string, number>();
  const pub = new Proxy(client.public, {
    get(target, prop, receiver) {
      const value: unknown = Reflect.get(target, prop, receiver);
      if (prop !== 'simulateContract' || typeof value !== 'function') return value;
      return (args: { functionName: string }) => {
        sends.set(args.functionName, (sends.get(args.functionName) ?? 0) + 1);
        return (value as (a: unknown) => unknown).call(target, args);
      };
    },
  });
  return { client: { ...client, public: pub }, sends };
}

function world(name: string, signer: SigningClient): { state: OrchestratorState; epochs: Epochs; sends: Map<string, number>; now: { t: number }; lines: string[] } {
  const state = OrchestratorState.open(join(dir, `${name}.sqlite`));
  const now = { t: T0 };
  const lines: string[] = [];
  const { client, sends } = counting(chain.client);
  const epochs = new Epochs(state, { client, signer, emission: parseEther('100'), log: (l) => lines.push(l), local: true }, () => now.t);
  return { state, epochs, sends, now, lines };
}

async function passes(epochs: Epochs, now: { t: number }, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    await epochs.reconcile();
    now.t += 500;
  }
}

test('a slash the chain refuses is tried 7 times in two minutes, not 240; a restart waits out its next try; then it is sent once', { timeout: 120_000 }, async () => {
  const stranger = chain.signer(7); // holds no role on Staking
  const w = world('slash', stranger);
  const miner = privateKeyToAccount(generatePrivateKey());
  await faucet(chain.client, miner.address, parseEther('40'));
  await addStake(chain.client, signerFor(chain.client, miner), parseEther('40'));
  w.state.ledger.putSlash({ epoch: 1, miner: miner.address, checkId: 1, fraction: 0.25, reason: 'nimble backoff-check 1' });

  await passes(w.epochs, w.now, PASSES);
  const tries = w.lines.filter((l) => /slashing .* failed \(attempt \d+\), retrying in/.test(l));
  assert.equal(tries.length, 7, tries.join('\n'));
  assert.equal(w.sends.get('slash'), 7, 'each try is one send, none between');
  const [s] = w.state.ledger.slashes();
  assert.deepEqual([s.status, s.attempts, s.retryAt], ['pending', 7, T0 + 63_000 + retryDelayMs(7)]);
  assert.match(s.error ?? '', /AccessControl|role|not allowed|revert/i);
  const view = epochView(w.state, w.state.ledger.openEpoch(w.now.t)).slashes[0];
  assert.deepEqual([view.attempts, view.retryAt], [7, s.retryAt], 'GET /epochs shows the tries and the next one');

  // a restart: a fresh Epochs on the same state, now with the orchestrator's key; the next try is still the recorded one
  const { client, sends } = counting(chain.client);
  const restarted = new Epochs(w.state, { client, signer: chain.operator, emission: parseEther('100'), log: () => {}, local: true }, () => w.now.t);
  await restarted.reconcile();
  assert.equal(sends.get('slash') ?? 0, 0, 'not sent before its next try');
  w.now.t = s.retryAt!;
  await restarted.reconcile();
  await restarted.reconcile();
  assert.equal(sends.get('slash'), 1, 'sent once');
  assert.equal(w.state.ledger.slashes()[0].status, 'slashed');
  assert.equal((await readStake(chain.client, miner.address)).staked, parseEther('30'));
  w.state.close();
});

test("an epoch's settlement the chain refuses backs off the same way, its tries and next try in its view", { timeout: 120_000 }, async () => {
  const w = world('settle', chain.signer(8)); // holds no role on the RewardDistributor
  const miner = privateKeyToAccount(generatePrivateKey()).address;
  w.state.ledger.logWork({ minerId: miner, runId: null, kind: 'forward', units: 3, stage: 0 }, T0);
  const closed = w.epochs.close(null, 0);
  assert.equal(closed?.status, 'settling');
  await passes(w.epochs, w.now, PASSES);
  const tries = w.lines.filter((l) => new RegExp(`epoch ${closed.id}: settlement failed \\(attempt \\d+\\), retrying in`).test(l));
  assert.equal(tries.length, 7, tries.join('\n'));
  const e = w.state.ledger.epoch(closed.id)!;
  assert.deepEqual([e.status, e.attempts, e.retryAt], ['settling', 7, T0 + 63_000 + retryDelayMs(7)]);
  const view = epochView(w.state, e);
  assert.deepEqual([view.attempts, view.retryAt, view.error], [7, e.retryAt, e.error]);
  w.state.close();
});
