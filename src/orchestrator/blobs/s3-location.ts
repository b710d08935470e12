// Where an S3 blob store is (parsed from --blobs by ./blob-store-url.ts, opened
// by ./blobs-s3.ts), apart from the store itself so that reading the flag does
// not load the AWS SDK: only an orchestrator that uses a bucket loads it.

/** Where the bucket is and how to reach it. */
export interface S3Location {
  bucket: string;
  /** key prefix, no slash at either end ('' : the bucket's root) */
  prefix: string;
  /** an S3-compatible server's http(s) URL; absent: AWS S3 */
  endpoint?: string;
  region: string;
  /** bucket in the path (http://host/bucket/key) rather than the host name */
  forcePathStyle: boolean;
}

/** A location as a person reads it: s3://bucket/prefix (endpoint or AWS region). */
export function describeS3(location: S3Location): string {
  return `s3://${location.bucket}${location.prefix ? `/${location.prefix}` : ''} (${location.endpoint ?? `AWS S3, region ${location.region}`})`;
}
