// Chain benches: settling one epoch for 1,000 miners on the local anvil node
// (first epoch: every miner's stake slot is new; repeat: the same miners
// again), and how long the local node takes to start from saved state.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getAddress, keccak256, parseUnits, toHex } from 'viem';
import { dumpAnvilState, LOCAL_CHAIN_ID, startAnvil } from '../src/chain/anvil.ts';
import { chainDefinition, createChainPublicClient, makeChainClient, signerFor } from '../src/chain/client.ts';
import { deployContracts } from '../src/chain/deploy.ts';
import { settleEpoch, type Reward } from '../src/chain/rewards.ts';
import { localOperatorAccount } from '../src/chain/session.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const MINERS = 1000;

export const chainBenches: Bench[] = [
  {
    group: 'chain',
    async run({ log }): Promise<BenchResult[]> {
      const dir = mkdtempSync(join(tmpdir(), 'nimble-bench-chain-'));
      const anvil = await startAnvil({ logFile: join(dir, 'anvil.log') });
      try {
        const chain = chainDefinition(LOCAL_CHAIN_ID, anvil.rpcUrl, true);
        const operator = signerFor({ chain, local: true }, localOperatorAccount());
        const deployment = await deployContracts({ chainId: LOCAL_CHAIN_ID, chain, local: true, public: createChainPublicClient(chain, true) }, operator, {
          orchestrator: operator.account.address,
          unstakeCooldownSeconds: 0,
        });
        const client = makeChainClient(anvil.rpcUrl, LOCAL_CHAIN_ID, true, deployment);
        const rewards: Reward[] = Array.from({ length: MINERS }, (_, i) => ({
          address: getAddress(keccak256(toHex(`bench-miner-${i}`)).slice(0, 42)),
          amount: parseUnits(String(1 + (i % 97)), 16),
        }));
        const results: BenchResult[] = [];
        for (const [epoch, name] of [
          [1n, 'chain.settle_1000'],
          [2n, 'chain.settle_1000_repeat'],
        ] as const) {
          const t0 = performance.now();
          const r = await settleEpoch(client, operator, epoch, rewards);
          const ms = performance.now() - t0;
          log(`${name}: ${r.batchCount} transactions, ${r.gasUsed} gas, ${ms.toFixed(0)} ms`);
          results.push(
            { bench: `${name}.ms`, value: Math.round(ms), unit: 'ms' },
            { bench: `${name}.gas_per_miner`, value: Math.round(Number(r.gasUsed) / MINERS), unit: 'gas' },
            { bench: `${name}.txs`, value: r.batchCount, unit: 'transactions' },
          );
        }
        // the cost every short nbcli command pays: start anvil from the saved state
        const state = join(dir, 'state.json');
        await dumpAnvilState(anvil.rpcUrl, state);
        const starts: number[] = [];
        for (let i = 0; i < 5; i++) {
          const t0 = performance.now();
          const node = await startAnvil({ logFile: join(dir, `restart-${i}.log`), stateFile: state });
          starts.push(performance.now() - t0);
          await node.stop();
        }
        results.push({ bench: 'chain.node_start_from_state.ms', value: Math.round(median(starts)), unit: 'ms' });
        return results;
      } finally {
        await anvil.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  },
];
