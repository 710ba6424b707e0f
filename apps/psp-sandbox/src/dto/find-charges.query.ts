import { ApiPropertyOptional } from '@nestjs/swagger';
import { Transform, Type } from 'class-transformer';
import { IsInt, IsOptional, isRFC3339, IsUUID, Matches, Max, Min, ValidateBy } from 'class-validator';
import { lowerCase } from './create-charge.dto.js';
import { CHARGE_ID_PATTERN } from './create-refund.dto.js';

export const MAX_CHARGES_PAGE = 100;

/**
 * An RFC 3339 date-time (OpenAPI's `date-time`) that names a real instant PostgreSQL can compare: the shape alone lets
 * 2026-02-30, a leap second and year 0000 through, which PostgreSQL refuses or rolls over (a 500, or another instant).
 */
function isInstant(value: unknown): value is string {
  if (typeof value !== 'string' || !isRFC3339(value) || Number.isNaN(Date.parse(value))) return false;
  const [year, month, day] = value.slice(0, 10).split('-').map(Number);
  // The day exists in that month when the calendar does not roll it over into the next.
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  return year >= 1 && date.getUTCDate() === day;
}

const IsInstant = () =>
  ValidateBy({
    name: 'isInstant',
    validator: {
      validate: isInstant,
      defaultMessage: () => '$property must be an RFC 3339 date-time with an offset, such as 2026-11-30T12:00:00.000Z',
    },
  });

/** Either a lookup (orderId and/or paymentId) or a listing (createdAfter, with startingAfter and limit): never both. */
export class FindChargesQuery {
  @ApiPropertyOptional({ format: 'uuid', description: 'Lookup: charges whose metadata.orderId is this.' })
  @IsOptional()
  @Transform(lowerCase)
  @IsUUID()
  orderId?: string;

  @ApiPropertyOptional({ format: 'uuid', description: 'Lookup: charges whose metadata.paymentId is this.' })
  @IsOptional()
  @Transform(lowerCase)
  @IsUUID()
  paymentId?: string;

  // No `example` or `default` on the listing's fields: Swagger UI's "Try it out" fills them in, and a lookup by paymentId
  // would then go out mixed with a listing and be refused.
  @ApiPropertyOptional({
    format: 'date-time',
    description:
      'Listing: charges created strictly after this instant, such as 2026-11-30T12:00:00.000Z. Required without orderId and paymentId; not allowed with them.',
  })
  @IsOptional()
  @IsInstant()
  createdAfter?: string;

  @ApiPropertyOptional({
    pattern: CHARGE_ID_PATTERN.source,
    description:
      "Listing: the page after this charge (the previous page's last item), such as ch_5f0c3e2a1b9d8c7e6f5a4b3c. It must name a charge.",
  })
  @IsOptional()
  @Matches(CHARGE_ID_PATTERN, { message: 'startingAfter must be a sandbox charge id such as ch_5f0c3e2a1b9d8c7e6f5a4b3c' })
  startingAfter?: string;

  @ApiPropertyOptional({
    minimum: 1,
    maximum: MAX_CHARGES_PAGE,
    description: `Listing: charges per page, ${MAX_CHARGES_PAGE} when not given.`,
  })
  @IsOptional()
  @Type(() => Number)
  @IsInt()
  @Min(1)
  @Max(MAX_CHARGES_PAGE)
  limit?: number;
}
