// Compiles the Solidity contracts in contracts/ with solc-js (offline: the
// compiler ships inside the npm package) and writes, for each contract,
// build/contracts/NAME.json = { contractName, abi, bytecode, deployedBytecode },
// and src/chain/abis.ts with every ABI as an `as const` export (committed, so a
// fresh clone typechecks before a build; regenerated identically here).
// @openzeppelin/... imports resolve from node_modules. Run by `npm install`
// (prepare) and `npm run build`.
import { mkdirSync, readdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import solc from 'solc';
import { ABIS_MODULE, renderAbisModule } from './abis-module.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const srcDir = join(root, 'contracts');
const outDir = join(root, 'build', 'contracts');

const sources = {};
for (const name of readdirSync(srcDir).filter((f) => f.endsWith('.sol')).sort()) {
  sources[name] = { content: readFileSync(join(srcDir, name), 'utf8') };
}

function findImports(path) {
  const candidates = [join(srcDir, path), join(root, 'node_modules', path)];
  for (const file of candidates) {
    if (existsSync(file)) return { contents: readFileSync(file, 'utf8') };
  }
  return { error: `import not found: ${path}` };
}

const input = {
  language: 'Solidity',
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: 'cancun',
    outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] } },
  },
};

const started = Date.now();
const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
for (const e of output.errors ?? []) process.stderr.write(`${e.formattedMessage}\n`);
if (errors.length > 0) {
  process.stderr.write(`build-contracts: ${errors.length} error(s)\n`);
  process.exit(1);
}

mkdirSync(outDir, { recursive: true });
const written = [];
const abis = [];
for (const file of Object.keys(sources)) {
  for (const [contractName, c] of Object.entries(output.contracts[file] ?? {})) {
    const artifact = {
      contractName,
      sourceName: `contracts/${file}`,
      compiler: `solc ${solc.version()}`,
      abi: c.abi,
      bytecode: `0x${c.evm.bytecode.object}`,
      deployedBytecode: `0x${c.evm.deployedBytecode.object}`,
    };
    writeFileSync(join(outDir, `${contractName}.json`), JSON.stringify(artifact, null, 2) + '\n');
    abis.push({ contractName, abi: c.abi });
    written.push(`${contractName} (${c.evm.deployedBytecode.object.length / 2} bytes)`);
  }
}
const abisFile = join(root, ABIS_MODULE);
const abisText = renderAbisModule(abis);
if (!existsSync(abisFile) || readFileSync(abisFile, 'utf8') !== abisText) writeFileSync(abisFile, abisText);
process.stdout.write(
  `build-contracts: ${written.join(', ')} -> build/contracts/, ${ABIS_MODULE} in ${((Date.now() - started) / 1000).toFixed(1)} s\n`,
);
