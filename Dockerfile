FROM node:26-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
# The idempotency package is an npm workspace: npm ci links it from its package.json.
COPY libs/idempotency/package.json ./libs/idempotency/
RUN npm ci --strict-allow-scripts --no-audit --no-fund
COPY . .
RUN npm run build && npm prune --omit=dev

FROM node:26-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
# node_modules/@idempotent-orders/idempotency links here: the package's manifest and its build.
COPY --from=build /app/libs/idempotency/package.json ./libs/idempotency/
COPY --from=build /app/libs/idempotency/dist ./libs/idempotency/dist
# The pattern pages Swagger UI links to (served at /patterns/<page>.md).
COPY --from=build /app/docs/patterns ./docs/patterns
COPY package.json ./
USER node
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --retries=5 CMD node -e "fetch('http://127.0.0.1:3000/health').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
CMD ["node", "dist/src/main.js"]
