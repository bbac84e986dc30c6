#!/bin/bash
echo tiger > /workspace/info.txt
