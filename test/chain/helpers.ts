// Shared by the chain tests: a fresh anvil on a free loopback port in a
// temporary folder, the contracts deployed, anvil's dev accounts as signers.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Address } from 'viem';
import { mnemonicToAccount } from 'viem/accounts';
import { LOCAL_CHAIN_ID, rpc, RPC_ANY, startAnvil, type AnvilProcess } from '../../src/chain/anvil.ts';
import { chainDefinition, createChainPublicClient, makeChainClient, signerFor, type ChainClient, type SigningClient } from '../../src/chain/client.ts';
import { jobEscrowAbi, nimAbi, stakingAbi } from '../../src/chain/abis.ts';
import { deployContracts } from '../../src/chain/deploy.ts';
import { mulberry32 } from '../../src/model/init.ts';

const DEV_MNEMONIC = 'test test test test test test test test test test test junk';

export interface TestChain {
  dir: string;
  anvil: AnvilProcess;
  client: ChainClient;
  /** dev account 0: admin, orchestrator, faucet */
  operator: SigningClient;
  /** dev account i (1..9) */
  signer(i: number): SigningClient;
  stop(): Promise<void>;
}

export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `nimble-${prefix}-`));
}

export async function startTestChain(opts: { cooldownSeconds?: number; escrowRefundDelaySeconds?: number } = {}): Promise<TestChain> {
  const dir = tempDir('chain');
  let anvil: AnvilProcess | undefined;
  try {
    anvil = await startAnvil({ logFile: join(dir, 'anvil.log') });
    const chain = chainDefinition(LOCAL_CHAIN_ID, anvil.rpcUrl, true);
    const signer = (i: number): SigningClient => signerFor({ chain, local: true }, mnemonicToAccount(DEV_MNEMONIC, { addressIndex: i }));
    const operator = signer(0);
    const deployment = await deployContracts(
      { chainId: LOCAL_CHAIN_ID, chain, local: true, public: createChainPublicClient(chain, true) },
      operator,
      {
        orchestrator: operator.account.address,
        faucet: operator.account.address,
        unstakeCooldownSeconds: opts.cooldownSeconds ?? 0,
        escrowRefundDelaySeconds: opts.escrowRefundDelaySeconds,
      },
    );
    const client = makeChainClient(anvil.rpcUrl, LOCAL_CHAIN_ID, true, deployment);
    const a = anvil;
    return {
      dir,
      anvil: a,
      client,
      operator,
      signer,
      async stop() {
        await a.stop();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await anvil?.stop();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

/** Moves the node's clock forward and mines a block. */
export async function advanceTime(client: ChainClient, seconds: number): Promise<void> {
  await rpc(client.rpcUrl, 'evm_increaseTime', [seconds], RPC_ANY);
  await rpc(client.rpcUrl, 'evm_mine', [], RPC_ANY);
}

export interface SupplyReport {
  totalSupply: bigint;
  free: bigint;
  staked: bigint;
  unstaking: bigint;
  undistributed: bigint;
  /** NIM held by the JobEscrow for open jobs (0 when the deployment has none) */
  escrowed: bigint;
}

/**
 * Conservation: total supply = free balances of `holders` + their stakes +
 * their unstaking tokens + tokens held by the distributor (undistributed) +
 * tokens held in job escrows. Also gives the Staking contract's and the
 * JobEscrow's own books to check against the sums.
 */
export async function supplyReport(
  client: ChainClient,
  holders: readonly Address[],
): Promise<SupplyReport & { stakingBalance: bigint; totalStaked: bigint; totalUnstaking: bigint; escrowTotalHeld: bigint }> {
  const d = client.deployment;
  const nim = { address: d.nim, abi: nimAbi } as const;
  const staking = { address: d.staking, abi: stakingAbi } as const;
  const balanceOf = (address: Address): Promise<bigint> => client.public.readContract({ ...nim, functionName: 'balanceOf', args: [address] });
  let free = 0n;
  let staked = 0n;
  let unstaking = 0n;
  for (const h of holders) {
    free += await balanceOf(h);
    staked += await client.public.readContract({ ...staking, functionName: 'stakeOf', args: [h] });
    unstaking += (await client.public.readContract({ ...staking, functionName: 'unstakingOf', args: [h] }))[0];
  }
  return {
    totalSupply: await client.public.readContract({ ...nim, functionName: 'totalSupply' }),
    free,
    staked,
    unstaking,
    undistributed: await balanceOf(d.rewardDistributor),
    escrowed: d.jobEscrow ? await balanceOf(d.jobEscrow) : 0n,
    escrowTotalHeld: d.jobEscrow ? await client.public.readContract({ address: d.jobEscrow, abi: jobEscrowAbi, functionName: 'totalHeld' }) : 0n,
    stakingBalance: await balanceOf(d.staking),
    totalStaked: await client.public.readContract({ ...staking, functionName: 'totalStaked' }),
    totalUnstaking: await client.public.readContract({ ...staking, functionName: 'totalUnstaking' }),
  };
}

/** A small deterministic PRNG (the engine's mulberry32), floats in [0, 1). */
export const prng = mulberry32;
