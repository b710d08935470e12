// The compiled contracts (ABI + bytecode) that scripts/build-contracts.mjs
// writes to build/contracts/, loaded once per process.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Abi, Hex } from 'viem';

export type ContractName = 'NIM' | 'Staking' | 'RewardDistributor' | 'ModelRegistry';

export interface ContractArtifact {
  contractName: ContractName;
  abi: Abi;
  bytecode: Hex;
}

/** The repository root: two levels above this file both in src/chain and dist/chain. */
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ARTIFACTS_DIR = join(root, 'build', 'contracts');

const cache = new Map<ContractName, ContractArtifact>();

export function artifact(name: ContractName): ContractArtifact {
  const hit = cache.get(name);
  if (hit) return hit;
  const file = join(ARTIFACTS_DIR, `${name}.json`);
  if (!existsSync(file)) {
    throw new Error(`contract artifact ${file} is missing: run \`npm run build:contracts\``);
  }
  const parsed = JSON.parse(readFileSync(file, 'utf8')) as ContractArtifact;
  cache.set(name, parsed);
  return parsed;
}

export function abiOf(name: ContractName): Abi {
  return artifact(name).abi;
}
