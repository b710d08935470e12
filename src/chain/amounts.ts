// NIM amounts: decimal strings typed by users <-> 18-decimal bigints on chain.
import { displayNim } from './nim-display.ts';
import { NimbleError } from '../protocol/errors.ts';

export const NIM_DECIMALS = 18;
const UNIT = 10n ** BigInt(NIM_DECIMALS);

/**
 * Parses a user's amount ("1", "1.5", "0.000000000000000001") into base units.
 * Rejects anything that is not a plain positive decimal with at most 18
 * fraction digits, with an error that names the flag.
 */
export function parseNim(value: string | undefined, flag = '--amount'): bigint {
  if (value === undefined || value.trim() === '') throw new NimbleError('invalid', `${flag} is required (an amount of NIM, e.g. 1.5)`);
  const s = value.trim().replace(/_/g, '');
  const m = /^(\d*)(?:\.(\d*))?$/.exec(s);
  if (!m || (m[1] === '' && (m[2] ?? '') === '')) {
    throw new NimbleError('invalid', `${flag} must be a number of NIM like 10 or 0.25, got '${value}'`);
  }
  const fraction = m[2] ?? '';
  if (fraction.length > NIM_DECIMALS) {
    throw new NimbleError('invalid', `${flag} has more than ${NIM_DECIMALS} decimal places: '${value}'`);
  }
  const units = BigInt(m[1] || '0') * UNIT + BigInt((fraction + '0'.repeat(NIM_DECIMALS)).slice(0, NIM_DECIMALS) || '0');
  if (units === 0n) throw new NimbleError('invalid', `${flag} must be more than 0, got '${value}'`);
  return units;
}

/** Formats base units as a decimal NIM string without trailing zeros: 1500000000000000000n -> "1.5". */
/** An amount as people read it: formatNim rounded for display (./nim-display.ts); JSON keeps formatNim's exact string. */
export function showNim(units: bigint): string {
  return displayNim(formatNim(units));
}

export function formatNim(units: bigint): string {
  const negative = units < 0n;
  const abs = negative ? -units : units;
  const whole = abs / UNIT;
  const fraction = (abs % UNIT).toString().padStart(NIM_DECIMALS, '0').replace(/0+$/, '');
  return `${negative ? '-' : ''}${whole}${fraction ? '.' + fraction : ''}`;
}
