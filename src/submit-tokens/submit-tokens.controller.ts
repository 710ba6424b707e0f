import { Controller, HttpCode, HttpStatus, Post } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOperation, ApiProperty, ApiTags } from '@nestjs/swagger';
import { UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS } from '../common/api-problems.js';
import { ClientId } from '../common/client-id.decorator.js';
import { SubmitTokensService } from './submit-tokens.service.js';
import { ApiProblems } from '#service-kit';

/** A submit token as the API shows it (docs/contract.md#json-shapes). */
export class SubmitTokenView {
  @ApiProperty({
    example: 'mJ0x9V2a0Zb3hN3o5tWkQ1cR8yL6pE4sD7fG2jK9uXw',
    description: '32 random bytes, base64url. Send it as Submit-Token on POST /orders.',
  })
  token: string;

  @ApiProperty({ format: 'date-time', description: 'After this the token is refused (422); get a new one.' })
  expiresAt: string;
}

@ApiTags('orders')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS)
@Controller('submit-tokens')
export class SubmitTokensController {
  constructor(private readonly submitTokens: SubmitTokensService) {}

  @Post()
  @HttpCode(HttpStatus.CREATED)
  @ApiOperation({
    summary: 'Get a single-use token for creating one order',
    description:
      'For a form: fetch a token when it is shown, send it as Submit-Token with POST /orders. However often the form is ' +
      'submitted, one order is created; later submits get 409 with its orderId. Lives SUBMIT_TOKEN_TTL_SECONDS (10 min by default). ' +
      'Issuing is harmless to repeat: an unused token simply expires.',
  })
  @ApiCreatedResponse({ type: SubmitTokenView })
  issueSubmitToken(@ClientId() clientId: string): Promise<SubmitTokenView> {
    return this.submitTokens.issueSubmitToken(clientId);
  }
}
