import { Module } from '@nestjs/common';
import { SubmitTokenReaper } from './submit-token-reaper.js';
import { SubmitTokensController } from './submit-tokens.controller.js';
import { SubmitTokensService } from './submit-tokens.service.js';

@Module({
  controllers: [SubmitTokensController],
  providers: [SubmitTokensService, SubmitTokenReaper],
  exports: [SubmitTokensService],
})
export class SubmitTokensModule {}
