// Deploying the four contracts and recording where they are:
// <data-dir>/chain/deployment.json = { "local": Deployment, "<chainId>": Deployment, ... }
// "local" is the node nbcli runs itself; any other chain is found by its chain
// id (so a remote anvil with the same chain id 31337 does not clash).
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { getAddress, keccak256, toHex, type Abi, type Address, type Hex, type PublicClient, type Transport, type Chain } from 'viem';
import type { ChainClient, Deployment, SigningClient } from './client.ts';
import { artifact, type ContractName } from './contracts.ts';
import { chainDir, writeJsonAtomic } from './node.ts';
import { sendContractTx } from './tx.ts';

export const MINTER_ROLE: Hex = keccak256(toHex('MINTER_ROLE'));
export const ORCHESTRATOR_ROLE: Hex = keccak256(toHex('ORCHESTRATOR_ROLE'));
export const DISTRIBUTOR_ROLE: Hex = keccak256(toHex('DISTRIBUTOR_ROLE'));

export interface DeployOptions {
  /** account given ORCHESTRATOR_ROLE everywhere */
  orchestrator: Address;
  /** account allowed to mint NIM at will: only for a local chain */
  faucet?: Address;
  unstakeCooldownSeconds: number;
}

type DeployTarget = Pick<ChainClient, 'chainId' | 'chain' | 'local'> & { public: PublicClient<Transport, Chain> };

/** Deploys NIM, Staking, RewardDistributor, ModelRegistry and wires their roles. */
export async function deployContracts(target: DeployTarget, deployer: SigningClient, opts: DeployOptions): Promise<Deployment> {
  const admin = deployer.account.address;
  const startBlock = await target.public.getBlockNumber();
  const deploy = async (name: ContractName, args: readonly unknown[]): Promise<Address> => {
    const a = artifact(name);
    const hash = await deployer.deployContract({ abi: a.abi, bytecode: a.bytecode, args });
    const receipt = await target.public.waitForTransactionReceipt({ hash });
    if (receipt.status !== 'success' || !receipt.contractAddress) throw new Error(`deploying ${name} failed (${hash})`);
    return getAddress(receipt.contractAddress);
  };
  const nim = await deploy('NIM', [admin]);
  const staking = await deploy('Staking', [nim, admin, opts.orchestrator, BigInt(opts.unstakeCooldownSeconds)]);
  const rewardDistributor = await deploy('RewardDistributor', [nim, staking, admin, opts.orchestrator]);
  const modelRegistry = await deploy('ModelRegistry', [admin, opts.orchestrator]);

  const grant = (address: Address, abi: Abi, role: Hex, account: Address) =>
    sendContractTx(target, deployer, { address, abi, functionName: 'grantRole', args: [role, account] });
  await grant(nim, artifact('NIM').abi, MINTER_ROLE, rewardDistributor);
  if (opts.faucet) await grant(nim, artifact('NIM').abi, MINTER_ROLE, opts.faucet);
  await grant(staking, artifact('Staking').abi, DISTRIBUTOR_ROLE, rewardDistributor);

  return {
    chainId: target.chainId,
    nim,
    staking,
    rewardDistributor,
    modelRegistry,
    deployer: admin,
    orchestrator: opts.orchestrator,
    ...(opts.faucet ? { faucet: opts.faucet } : {}),
    deployBlock: String(startBlock + 1n),
    unstakeCooldownSeconds: opts.unstakeCooldownSeconds,
    deployedAt: new Date().toISOString(),
  };
}

export function deploymentFile(dataDir: string): string {
  return join(chainDir(dataDir), 'deployment.json');
}

export function readDeployments(dataDir: string): Record<string, Deployment> {
  const file = deploymentFile(dataDir);
  if (!existsSync(file)) return {};
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as Record<string, Deployment>;
  } catch (err) {
    throw new Error(`${file} is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
}

export const LOCAL_DEPLOYMENT_KEY = 'local';

/** Records `deployment` under "local" or under its chain id. */
export function saveDeployment(dataDir: string, deployment: Deployment, key: string = String(deployment.chainId)): void {
  const all = readDeployments(dataDir);
  all[key] = deployment;
  mkdirSync(chainDir(dataDir), { recursive: true });
  writeJsonAtomic(deploymentFile(dataDir), all);
}
