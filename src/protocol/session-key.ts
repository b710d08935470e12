// Ed25519 keys for what must be signed often and checked fast: a miner's
// session key (registered at join under its wallet's signature, then signing
// its requests and receipts) and the orchestrator's identity key (signing
// tickets for the microbatches it issues). An Ed25519 signature is checked in
// about 0.07 ms where recovering a secp256k1 one takes about 1.6 ms (docs/protocol.md §8), so a flood
// of forged signatures costs little to refuse. Keys and signatures travel as
// base64url.
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign, verify, type KeyObject } from 'node:crypto';

/** A public key: 32 bytes, base64url (43 characters). */
export const PUBLIC_KEY_PATTERN = '^[A-Za-z0-9_-]{43}$';
/** A signature: 64 bytes, base64url (86 characters). */
export const SIGNATURE_PATTERN = '^[A-Za-z0-9_-]{86}$';
const PUBLIC_KEY_RE = new RegExp(PUBLIC_KEY_PATTERN);
const SIGNATURE_RE = new RegExp(SIGNATURE_PATTERN);

export class SessionKey {
  private constructor(
    private readonly privateKey: KeyObject,
    /** base64url of the raw public key */
    readonly publicKey: string,
  ) {}

  static generate(): SessionKey {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    return new SessionKey(privateKey, rawPublicKey(publicKey));
  }

  /** A key saved with `toPkcs8` (base64url of its PKCS#8 DER). */
  static fromPkcs8(der: string): SessionKey {
    const privateKey = createPrivateKey({ key: Buffer.from(der, 'base64url'), format: 'der', type: 'pkcs8' });
    if (privateKey.asymmetricKeyType !== 'ed25519') throw new RangeError('not an Ed25519 key');
    return new SessionKey(privateKey, rawPublicKey(createPublicKey(privateKey)));
  }

  toPkcs8(): string {
    return this.privateKey.export({ format: 'der', type: 'pkcs8' }).toString('base64url');
  }

  /** The signature of `message` (UTF-8), base64url. */
  sign(message: string): string {
    return sign(null, Buffer.from(message, 'utf8'), this.privateKey).toString('base64url');
  }
}

function rawPublicKey(key: KeyObject): string {
  const x = key.export({ format: 'jwk' }).x;
  if (typeof x !== 'string') throw new Error('cannot export an Ed25519 public key');
  return x;
}

const keys = new Map<string, KeyObject>();

/** Whether `signature` is `publicKey`'s signature of `message`; false for anything malformed. */
export function verifySignature(publicKey: string, message: string, signature: string): boolean {
  if (!PUBLIC_KEY_RE.test(publicKey) || !SIGNATURE_RE.test(signature)) return false;
  let key = keys.get(publicKey);
  if (!key) {
    try {
      key = createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: publicKey }, format: 'jwk' });
    } catch {
      return false;
    }
    if (keys.size >= 10_000) keys.clear();
    keys.set(publicKey, key);
  }
  const bytes = Buffer.from(signature, 'base64url');
  // one encoding per signature: the spare bits of the last character must be zero
  if (bytes.toString('base64url') !== signature) return false;
  try {
    return verify(null, Buffer.from(message, 'utf8'), key, bytes);
  } catch {
    return false;
  }
}
