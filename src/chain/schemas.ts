// TypeBox pieces for the JSON files and answers src/chain reads, and one
// helper that reads a JSON file and validates it once, naming the file.
import { readFileSync } from 'node:fs';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import type { Address, Hex } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { parse } from '../protocol/messages.ts';

/** A 20-byte address, 0x-prefixed, any case; typed as viem's Address. */
export const AddressString = Type.Unsafe<Address>(Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' }));

/** 0x-prefixed hex of whole bytes; typed as viem's Hex. */
export const HexString = Type.Unsafe<Hex>(Type.String({ pattern: '^0x([0-9a-fA-F]{2})*$' }));

/** A 32-byte hash (a block's), 0x-prefixed; typed as viem's Hex. */
export const HashString = Type.Unsafe<Hex>(Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' }));

/** 0x-prefixed hex quantity (a JSON-RPC number such as eth_chainId's answer). */
export const HexQuantity = Type.Unsafe<Hex>(Type.String({ pattern: '^0x[0-9a-fA-F]+$' }));

/**
 * The JSON in `file`, validated against `schema`; a NimbleError 'corrupt'
 * naming the file (as "WHAT FILE") when it is not JSON or does not match.
 */
export function readJsonFile<T extends TSchema>(schema: T, file: string, what: string): Static<T> {
  const text = readFileSync(file, 'utf8');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw new NimbleError('corrupt', `${what} ${file} is not valid JSON: ${reason}`, undefined, { cause: err });
  }
  return parse(schema, value, `${what} ${file}`, 'corrupt');
}
