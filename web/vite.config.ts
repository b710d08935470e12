// Builds the dashboard (web/) into dist/web, which the orchestrator serves at /
// (src/orchestrator/routes/dashboard.ts): hashed file names under assets/, no
// inline scripts (the page's Content-Security-Policy allows its own files only).
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = fileURLToPath(new URL('.', import.meta.url));

export default defineConfig({
  root: here,
  base: '/',
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/web', import.meta.url)),
    emptyOutDir: true,
    target: 'es2022',
    assetsDir: 'assets',
    // no data: URLs for modules or fonts; everything is a file of its own
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    reportCompressedSize: false,
  },
});
