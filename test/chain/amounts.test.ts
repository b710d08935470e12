import assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatNim, parseNim } from '../../src/chain/amounts.ts';
import { NimbleError } from '../../src/protocol/errors.ts';

test('parseNim reads decimal NIM into 18-decimal units', () => {
  assert.equal(parseNim('1'), 10n ** 18n);
  assert.equal(parseNim('1.5'), 15n * 10n ** 17n);
  assert.equal(parseNim('.25'), 25n * 10n ** 16n);
  assert.equal(parseNim('0.000000000000000001'), 1n);
  assert.equal(parseNim('1_000'), 1000n * 10n ** 18n);
  assert.equal(parseNim(' 7. '), 7n * 10n ** 18n);
});

test('parseNim rejects what is not a positive amount, naming the flag', () => {
  for (const bad of ['', 'abc', '-1', '1e3', '0', '0.0', '1.2.3', '0x10', 'NaN', 'Infinity', '.', '0.0000000000000000001']) {
    assert.throws(() => parseNim(bad), (err: unknown) => err instanceof NimbleError && err.code === 'invalid' && err.status === 400 && err.message.includes('--amount'), bad);
  }
  assert.throws(() => parseNim(undefined, '--stake'), /--stake is required/);
});

test('formatNim prints exact decimals without trailing zeros', () => {
  assert.equal(formatNim(0n), '0');
  assert.equal(formatNim(15n * 10n ** 17n), '1.5');
  assert.equal(formatNim(1n), '0.000000000000000001');
  assert.equal(formatNim(-(10n ** 18n)), '-1');
  for (const s of ['3', '0.1', '123456789.000000000000000009']) assert.equal(formatNim(parseNim(s)), s);
});
