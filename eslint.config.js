// ESLint: the recommended rules plus typescript-eslint's, over src/, test/, bench/, scripts/ and web/ (the dashboard, with no HTML from strings).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'build/', 'node_modules/', 'assembly/', 'scratch/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: {
        process: 'readonly', console: 'readonly', Buffer: 'readonly', URL: 'readonly',
        setTimeout: 'readonly', clearTimeout: 'readonly', setInterval: 'readonly', clearInterval: 'readonly',
        performance: 'readonly', SharedArrayBuffer: 'readonly', Atomics: 'readonly', WebAssembly: 'readonly',
        TextEncoder: 'readonly', TextDecoder: 'readonly', AbortController: 'readonly', fetch: 'readonly',
        structuredClone: 'readonly', queueMicrotask: 'readonly', setImmediate: 'readonly',
      },
    },
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  // the dashboard puts data in as text only (web/src/dom.ts): no HTML parsing of strings, ever
  {
    files: ['web/**/*.ts'],
    rules: {
      'no-restricted-properties': [
        'error',
        { property: 'innerHTML', message: 'build elements with h() from web/src/dom.ts: data goes in as text' },
        { property: 'outerHTML', message: 'build elements with h() from web/src/dom.ts: data goes in as text' },
        { property: 'insertAdjacentHTML', message: 'build elements with h() from web/src/dom.ts: data goes in as text' },
        { object: 'document', property: 'write', message: 'build elements with h() from web/src/dom.ts' },
      ],
    },
  },
);
