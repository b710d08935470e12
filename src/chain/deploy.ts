// Deploying the contracts and recording where they are:
// <data-dir>/chain/deployment.json = { "local": Deployment, "<chainId>": Deployment, ... }
// "local" is the node nbcli runs itself; any other chain is found by its chain
// id (so a remote anvil with the same chain id 31337 does not clash).
// A deployment recorded before JobEscrow existed has no `jobEscrow`:
// `upgradeDeployment` adds it (and the attested ModelRegistry) with the admin key;
// one whose JobEscrow predates the orchestrator's lock gets a new JobEscrow.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Type } from '@sinclair/typebox';
import { getAddress, keccak256, toHex, type Address, type Chain, type Hash, type Hex, type PublicClient, type Transport } from 'viem';
import { jobEscrowAbi, modelRegistryAbi, nimAbi, rewardDistributorAbi, stakingAbi } from './abis.ts';
import type { ChainClient, Deployment, SigningClient } from './client.ts';
import { bytecodeOf, type ContractName } from './contracts.ts';
import { chainDir, writeJsonAtomic } from './node.ts';
import { AddressString, readJsonFile } from './schemas.ts';
import { sendContractTx, type SentTx } from './tx.ts';

export const MINTER_ROLE: Hex = keccak256(toHex('MINTER_ROLE'));
export const ORCHESTRATOR_ROLE: Hex = keccak256(toHex('ORCHESTRATOR_ROLE'));
export const DISTRIBUTOR_ROLE: Hex = keccak256(toHex('DISTRIBUTOR_ROLE'));

export interface DeployOptions {
  /** account given ORCHESTRATOR_ROLE everywhere */
  orchestrator: Address;
  /** account allowed to mint NIM at will: only for a local chain */
  faucet?: Address;
  unstakeCooldownSeconds: number;
  /** seconds after opening from which a job's owner may close its escrow itself (default 30 days) */
  escrowRefundDelaySeconds?: number;
  /** seconds the orchestrator's lock on an escrow holds after its last renewal (default 14 days) */
  escrowLockSeconds?: number;
}

/** Default `JobEscrow.refundDelay`: a developer gets an unfinished job's NIM back alone after 30 days. */
export const DEFAULT_ESCROW_REFUND_DELAY_SECONDS = 30 * 24 * 3600;
/**
 * Default `JobEscrow.lockTimeout`: an escrow that pays for work stays locked
 * this long after the orchestrator last renewed its lock (14 days: twice the
 * longest job, MAX_JOB_TIMEOUT); after an orchestrator vanished, its owner
 * closes it alone once that has passed.
 */
export const DEFAULT_ESCROW_LOCK_SECONDS = 14 * 24 * 3600;

type DeployTarget = Pick<ChainClient, 'chainId' | 'chain' | 'local'> & { public: PublicClient<Transport, Chain> };

/** The address of the contract created by transaction `hash`. */
async function deployedAt(target: DeployTarget, name: ContractName, hash: Hash): Promise<Address> {
  const receipt = await target.public.waitForTransactionReceipt({ hash });
  if (receipt.status !== 'success' || !receipt.contractAddress) throw new Error(`deploying ${name} failed (${hash})`);
  return getAddress(receipt.contractAddress);
}

/** Deploys NIM, Staking, RewardDistributor, ModelRegistry, JobEscrow and wires their roles. */
export async function deployContracts(target: DeployTarget, deployer: SigningClient, opts: DeployOptions): Promise<Deployment> {
  const admin = deployer.account.address;
  const startBlock = await target.public.getBlockNumber();
  const deployed = (name: ContractName, hash: Hash): Promise<Address> => deployedAt(target, name, hash);
  const nim = await deployed('NIM', await deployer.deployContract({ abi: nimAbi, bytecode: bytecodeOf('NIM'), args: [admin] }));
  const staking = await deployed(
    'Staking',
    await deployer.deployContract({
      abi: stakingAbi,
      bytecode: bytecodeOf('Staking'),
      args: [nim, admin, opts.orchestrator, BigInt(opts.unstakeCooldownSeconds)],
    }),
  );
  const rewardDistributor = await deployed(
    'RewardDistributor',
    await deployer.deployContract({ abi: rewardDistributorAbi, bytecode: bytecodeOf('RewardDistributor'), args: [nim, staking, admin, opts.orchestrator] }),
  );
  const modelRegistry = await deployModelRegistry(target, deployer, opts.orchestrator);

  const grantMinter = (account: Address): Promise<SentTx> =>
    sendContractTx(target, deployer, { address: nim, abi: nimAbi, functionName: 'grantRole', args: [MINTER_ROLE, account] });
  await grantMinter(rewardDistributor);
  if (opts.faucet) await grantMinter(opts.faucet);
  await sendContractTx(target, deployer, { address: staking, abi: stakingAbi, functionName: 'grantRole', args: [DISTRIBUTOR_ROLE, rewardDistributor] });
  const jobEscrow = await deployJobEscrow(target, deployer, { nim, staking, orchestrator: opts.orchestrator }, opts);

  return {
    chainId: target.chainId,
    nim,
    staking,
    rewardDistributor,
    modelRegistry,
    jobEscrow,
    deployer: admin,
    orchestrator: opts.orchestrator,
    ...(opts.faucet ? { faucet: opts.faucet } : {}),
    deployBlock: String(startBlock + 1n),
    unstakeCooldownSeconds: opts.unstakeCooldownSeconds,
    deployedAt: new Date().toISOString(),
  };
}

async function deployModelRegistry(target: DeployTarget, deployer: SigningClient, orchestrator: Address): Promise<Address> {
  const hash = await deployer.deployContract({ abi: modelRegistryAbi, bytecode: bytecodeOf('ModelRegistry'), args: [deployer.account.address, orchestrator] });
  return deployedAt(target, 'ModelRegistry', hash);
}

/**
 * Deploys JobEscrow for the NIM and Staking of a deployment and lets it credit
 * stakes (Staking's DISTRIBUTOR_ROLE: job payments land as stake like epoch
 * rewards). The deployer must be the Staking admin.
 */
async function deployJobEscrow(
  target: DeployTarget,
  deployer: SigningClient,
  at: Pick<Deployment, 'nim' | 'staking' | 'orchestrator'>,
  opts: Pick<DeployOptions, 'escrowRefundDelaySeconds' | 'escrowLockSeconds'> = {},
): Promise<Address> {
  const refundDelaySeconds = opts.escrowRefundDelaySeconds ?? DEFAULT_ESCROW_REFUND_DELAY_SECONDS;
  const lockSeconds = opts.escrowLockSeconds ?? DEFAULT_ESCROW_LOCK_SECONDS;
  if (!Number.isInteger(refundDelaySeconds) || refundDelaySeconds < 0) throw new Error(`invalid escrow refund delay ${refundDelaySeconds}`);
  if (!Number.isInteger(lockSeconds) || lockSeconds < 1) throw new Error(`invalid escrow lock timeout ${lockSeconds}`);
  const hash = await deployer.deployContract({
    abi: jobEscrowAbi,
    bytecode: bytecodeOf('JobEscrow'),
    args: [at.nim, at.staking, deployer.account.address, at.orchestrator, BigInt(refundDelaySeconds), BigInt(lockSeconds)],
  });
  const jobEscrow = await deployedAt(target, 'JobEscrow', hash);
  await sendContractTx(target, deployer, { address: at.staking, abi: stakingAbi, functionName: 'grantRole', args: [DISTRIBUTOR_ROLE, jobEscrow] });
  return jobEscrow;
}

/** Whether the JobEscrow at `address` has the orchestrator's lock (`lockTimeout`): one deployed before it has not. */
export async function escrowHasLock(pub: PublicClient<Transport, Chain>, address: Address): Promise<boolean> {
  try {
    await pub.readContract({ address, abi: jobEscrowAbi, functionName: 'lockTimeout' });
    return true;
  } catch {
    return false;
  }
}

/** Whether `deployment` is up to date: a JobEscrow that has the orchestrator's lock. */
export async function deploymentIsCurrent(target: DeployTarget, deployment: Deployment): Promise<boolean> {
  return deployment.jobEscrow !== undefined && (await escrowHasLock(target.public, deployment.jobEscrow));
}

/**
 * Brings a deployment recorded before JobEscrow up to date, with the admin
 * key (`deployer`): deploys JobEscrow, and a new ModelRegistry, since the old
 * one's `publish` took no orchestrator attestation (models published on the
 * old registry stay there but are no longer listed). A deployment whose
 * JobEscrow predates the orchestrator's lock gets a new JobEscrow (escrows
 * open on the old one stay there: their owners close them from their refund
 * time on). Returns the deployment unchanged when it is current.
 */
export async function upgradeDeployment(target: DeployTarget, deployer: SigningClient, deployment: Deployment, opts: Pick<DeployOptions, 'escrowRefundDelaySeconds' | 'escrowLockSeconds'> = {}): Promise<Deployment> {
  if (await deploymentIsCurrent(target, deployment)) return deployment;
  if (getAddress(deployer.account.address) !== getAddress(deployment.deployer)) {
    throw new Error(`upgrading the deployment on chain ${deployment.chainId} needs its admin ${deployment.deployer}, not ${deployer.account.address}`);
  }
  const modelRegistry = deployment.jobEscrow ? deployment.modelRegistry : await deployModelRegistry(target, deployer, deployment.orchestrator);
  const jobEscrow = await deployJobEscrow(target, deployer, deployment, opts);
  return { ...deployment, modelRegistry, jobEscrow };
}

export function deploymentFile(dataDir: string): string {
  return join(chainDir(dataDir), 'deployment.json');
}

/** One entry of deployment.json (see Deployment in client.ts); also the contracts of an orchestrator's GET /chain. */
export const DeploymentEntry = Type.Object({
  chainId: Type.Integer({ minimum: 1 }),
  nim: AddressString,
  staking: AddressString,
  rewardDistributor: AddressString,
  modelRegistry: AddressString,
  jobEscrow: Type.Optional(AddressString),
  deployer: AddressString,
  orchestrator: AddressString,
  faucet: Type.Optional(AddressString),
  deployBlock: Type.String({ pattern: '^[0-9]+$' }),
  unstakeCooldownSeconds: Type.Integer({ minimum: 0 }),
  deployedAt: Type.String(),
});

/** deployment.json: `{ "local": Deployment, "<chainId>": Deployment, ... }`. */
const DeploymentsFile = Type.Record(Type.String(), DeploymentEntry);

export function readDeployments(dataDir: string): Record<string, Deployment> {
  const file = deploymentFile(dataDir);
  if (!existsSync(file)) return {};
  return readJsonFile(DeploymentsFile, file, 'deployment file');
}

export const LOCAL_DEPLOYMENT_KEY = 'local';

/** Records `deployment` under "local" or under its chain id. */
export function saveDeployment(dataDir: string, deployment: Deployment, key: string = String(deployment.chainId)): void {
  const all = readDeployments(dataDir);
  all[key] = deployment;
  mkdirSync(chainDir(dataDir), { recursive: true });
  writeJsonAtomic(deploymentFile(dataDir), all);
}
