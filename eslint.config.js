// ESLint: the recommended rules plus typescript-eslint's, over src/, test/, bench/ and scripts/.
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
);
