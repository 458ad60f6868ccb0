// What a client developer writes against the TypeScript types openapi-typescript
// generates from openapi/v1.yaml (./v1.ts) and openapi/dashboard.yaml (./dashboard.ts),
// with openapi-fetch. scripts/openapi-check.sh generates the types beside a copy of
// this file and type-checks it with tsc --strict: a document whose types make a PATCH
// send every field, leave config unusable or errors impossible to narrow fails there.
import createClient from "openapi-fetch";

import type { paths as Dashboard } from "./dashboard";
import type { components, paths as V1 } from "./v1";

type Monitor = components["schemas"]["Monitor"];
type V1Error =
  | components["schemas"]["ErrorInvalidRequest"]
  | components["schemas"]["ErrorUnauthenticated"]
  | components["schemas"]["ErrorQuotaExceeded"]
  | components["schemas"]["ErrorForbiddenOrFeatureGated"]
  | components["schemas"]["ErrorMonitorNotFound"]
  | components["schemas"]["ErrorRequestTooLarge"]
  | components["schemas"]["ErrorRateLimited"]
  | components["schemas"]["ErrorBadGateway"]
  | components["schemas"]["ErrorServiceUnavailable"]
  | components["schemas"]["ErrorGatewayTimeout"];

// describe narrows an error body on its error member, as the documents tell clients to.
export function describe(e: V1Error): string {
  switch (e.error) {
    case "invalid_request":
      return `${e.error}: ${e.message}`;
    case "quota_exceeded": {
      const upgrade: boolean = e.upgrade;
      const used = e.limit === undefined ? "" : `, ${e.used} of ${e.limit} used`;
      return `${e.error} (${e.metric})${used}, upgrade: ${upgrade}`;
    }
    case "feature_gated":
      return `${e.error} (${e.feature}), upgrade: ${e.upgrade}`;
    case "rate_limited":
      if (e.fits === false) {
        return `${e.error}: costs ${e.cost} units, more than the ${e.window} allows (${e.limit})`;
      }
      return `${e.error} (${e.budget} ${e.window}): retry after ${e.retryAfter}s`;
    case "forbidden":
    case "api key unauthenticated":
    case "monitor not found":
    case "request_too_large":
    case "bad_gateway":
    case "service_unavailable":
    case "gateway_timeout":
      return e.error;
  }
}

export async function createAndRename(baseUrl: string, key: string): Promise<Monitor> {
  const api = createClient<V1>({ baseUrl, headers: { Authorization: `Bearer ${key}` } });
  const created = await api.POST("/v1/monitors", {
    body: {
      name: "homepage",
      type: "http",
      target: "https://example.com/health",
      config: { method: "GET", headers: { "X-Probe": "1" }, retries: 3 },
      assertions: [{ type: "status", equals: 200 }],
    },
  });
  if (created.error) {
    throw new Error(describe(created.error));
  }
  // A PATCH of one field: interval_seconds and locations stay as they are.
  const renamed = await api.PATCH("/v1/monitors/{monitorId}", {
    params: { path: { monitorId: created.data.id } },
    body: { name: "renamed" },
  });
  if (renamed.error) {
    throw new Error(describe(renamed.error));
  }
  return renamed.data;
}

export async function pauseThroughTheDashboard(baseUrl: string, orgId: string, monitorId: string): Promise<Monitor> {
  const dash = createClient<Dashboard>({ baseUrl, credentials: "include" });
  const { data, error } = await dash.PATCH("/orgs/{orgId}/monitors/{monitorId}", {
    params: { path: { orgId, monitorId } },
    body: { paused: true },
  });
  if (error) {
    throw new Error(error.error);
  }
  return data;
}
