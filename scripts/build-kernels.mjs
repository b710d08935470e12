// Compiles the AssemblyScript kernels in assembly/ to two WebAssembly modules:
//   build/kernels-relaxed.wasm  SIMD + relaxed SIMD (fused multiply-add)
//   build/kernels-simd.wasm     plain SIMD, for runtimes without relaxed SIMD
// Both import a shared memory (env.memory) so that worker threads can run
// them on the same tensors. Run by `npm install` (prepare) and `npm run build`.
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import asc from 'assemblyscript/asc';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
mkdirSync(join(root, 'build'), { recursive: true });

const common = [
  join(root, 'assembly/index.ts'),
  '--runtime', 'stub',
  '--optimizeLevel', '3',
  '--shrinkLevel', '0',
  '--noAssert',
  '--importMemory',
  '--sharedMemory',
  '--initialMemory', '1',
  '--maximumMemory', '65536',
  '--enable', 'simd',
  '--enable', 'threads',
];

const variants = [
  { file: 'kernels-relaxed.wasm', extra: ['--enable', 'relaxed-simd'] },
  { file: 'kernels-simd.wasm', extra: [] },
];

for (const variant of variants) {
  const out = join(root, 'build', variant.file);
  const { error, stderr } = await asc.main([...common, ...variant.extra, '--outFile', out]);
  if (error) {
    console.error(stderr.toString());
    console.error(`build-kernels: ${variant.file} failed: ${error.message}`);
    process.exit(1);
  }
  console.log(`build-kernels: wrote build/${variant.file}`);
}
